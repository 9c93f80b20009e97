#!/usr/bin/env bash
# The install tree of `bazel run //tools:install -- PREFIX`: exactly the public headers (each one
# is read when a program includes fabric/all.h or the GPT's headers, and nothing else is there), a versioned shared
# library that carries all of Fabric++ and runs against the build's LibTorch, and an installer that
# replaces its own files only.
source tests/packaging/testing.sh
install_prefix

# 1. The headers a compile of fabric/all.h and //:gpt's three reads from the prefix = the headers
#    installed.
printf '#include "%s"\n' fabric/all.h fabric/models/gpt.h fabric/data/tokens.h fabric/data/bpe.h \
  >"$TEST_TMPDIR/use.cc"
# shellcheck disable=SC2046
g++ $(pkg-config --cflags fabricpp) -M "$TEST_TMPDIR/use.cc" -o "$TEST_TMPDIR/use.d" ||
  fail "the public headers do not preprocess with only the installed headers (pkg-config --cflags)"
read_headers=$(tr ' \\' '\n\n' <"$TEST_TMPDIR/use.d" | grep "^$PREFIX/include/fabricpp/" |
  sed "s|^$PREFIX/include/fabricpp/||" | sort -u)
installed=$(cd "$PREFIX/include/fabricpp" && find . -type f | sed 's|^\./||' | sort)
extra=$(comm -13 <(echo "$read_headers") <(echo "$installed"))
missing=$(comm -23 <(echo "$read_headers") <(echo "$installed"))
check "no installed header is unused by the public ones (private headers: '${extra//$'\n'/ }')" test -z "$extra"
check "every header the public ones read is installed (missing: '${missing//$'\n'/ }')" test -z "$missing"
check "the public headers are a fraction of the project's ($(wc -l <<<"$installed") of $(wc -l <tools/packaging/project_headers.txt))" \
  test "$(wc -l <<<"$installed")" -lt "$(wc -l <tools/packaging/project_headers.txt)"
for private in fabric/distributed/restart_agent.h strategies/ddp.h fabric/checkpoint/format.h; do
  check "internal header $private is not installed" test ! -e "$PREFIX/include/fabricpp/$private"
done

# 2. The library: versioned name and links, soname, run path, nothing of Fabric++ left undefined.
lib="$PREFIX/lib/libfabricpp.so.$FABRIC_VERSION"
check "lib/libfabricpp.so -> libfabricpp.so.$FABRIC_SOVERSION -> libfabricpp.so.$FABRIC_VERSION" \
  test "$(readlink "$PREFIX/lib/libfabricpp.so")" = "libfabricpp.so.$FABRIC_SOVERSION" -a \
       "$(readlink "$PREFIX/lib/libfabricpp.so.$FABRIC_SOVERSION")" = "libfabricpp.so.$FABRIC_VERSION"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
check "soname is libfabricpp.so.$FABRIC_SOVERSION (got '$soname')" test "$soname" = "libfabricpp.so.$FABRIC_SOVERSION"
runpath=$(readelf -d "$lib" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
check "run path is the build's LibTorch folders (got '$runpath')" test "$runpath" = "$RUNTIME_LIB_DIRS"
undefined=$(nm -D --undefined-only -C "$lib" | grep -c 'fabric::')
check "no undefined fabric:: symbols ($undefined)" test "$undefined" -eq 0
defined=$(nm -D --defined-only -C "$lib" | grep -c 'fabric::Fabric::')
check "fabric::Fabric's methods are exported ($defined)" test "$defined" -gt 20
needs_cuda=$(readelf -d "$lib" | grep -c 'libtorch_cuda.so')
check "links libtorch_cuda exactly when built with CUDA (WITH_CUDA=$WITH_CUDA, NEEDED $needs_cuda)" \
  test "$needs_cuda" -eq "$WITH_CUDA"
unresolved=$(ldd -r "$lib" 2>&1 | grep -c 'undefined symbol\|not found')
check "every dependency and symbol resolves (ldd -r: $unresolved problems)" test "$unresolved" -eq 0

# 3. The CMake and pkg-config files name this version and this build.
check "pkg-config --modversion fabricpp is $FABRIC_VERSION" test "$(pkg-config --modversion fabricpp)" = "$FABRIC_VERSION"
cuda_flag=$(pkg-config --cflags fabricpp | grep -c -- '-DFABRIC_WITH_CUDA')
check "pkg-config defines FABRIC_WITH_CUDA exactly in a CUDA build" test "$cuda_flag" -eq "$WITH_CUDA"
check "FabricPPConfig.cmake names LibTorch $LIBTORCH_VERSION" \
  grep -q "VERSION_EQUAL \"$LIBTORCH_VERSION\"" "$PREFIX/lib/cmake/FabricPP/FabricPPConfig.cmake"
module_version=$(sed -n 's/^ *version = "\(.*\)",*$/\1/p' MODULE.bazel | head -n1)
check "MODULE.bazel's version ($module_version) is tools/bazel/version.bzl's ($FABRIC_VERSION)" \
  test "$module_version" = "$FABRIC_VERSION"

# 4. A second install replaces its own files (a stale header goes) and nothing else.
touch "$PREFIX/include/fabricpp/fabric/stale.h" "$PREFIX/include/other_project.h"
tools/install "$PREFIX" >/dev/null 2>&1 || fail "a second install into the same prefix failed"
check "a second install removes a stale header" test ! -e "$PREFIX/include/fabricpp/fabric/stale.h"
check "a second install keeps another project's file" test -e "$PREFIX/include/other_project.h"

# 5. Bad usage: one line naming the problem.
out=$(tools/install "$TEST_TMPDIR/install.log/sub" 2>&1); rc=$?
check "a prefix that cannot be created: exit 1 and one line (got $rc: $out)" \
  test $rc -eq 1 -a "$(wc -l <<<"$out")" -eq 1
out=$(tools/install 2>&1); rc=$?
check "no prefix: exit 2 with the usage (got $rc: $out)" test $rc -eq 2
finish
