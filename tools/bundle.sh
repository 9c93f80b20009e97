#!/usr/bin/env bash
# bazel run //tools:bundle -- --out=DIR [--bazel_flag=FLAG ...] [TARGET ...]
#
# Writes a relocatable folder for GPU nodes that have PyTorch in Python but no Bazel, Java or network:
#   DIR/bin/       the chosen binaries (stripped; RUNPATH $ORIGIN/../lib), linked dynamically
#                  (bazel build --dynamic_mode=fully): the examples, tools and tests share one
#                  copy of this project's libraries instead of each carrying its own
#   DIR/lib/       the non-LibTorch shared libraries they need (yaml-cpp, glog, gflags, ... and
#                  this project's own libraries)
#   DIR/configs/   the repository's configs/
#   DIR/run.sh     finds LibTorch on the node and runs a binary: DIR/run.sh NAME [ARGS...]
#   DIR/install.sh installs Fabric++ for CMake and pkg-config consumers on the node:
#                  DIR/install.sh PREFIX (tools/packaging/install.sh; files in DIR/install/)
#   DIR/MANIFEST   revision, LibTorch version and glibc the bundle was built with
#
# TARGETs default to every cc_binary under //examples/... but those tagged `no_gpu_bundle` (kept out
# to stay under the 64 MiB a GPU call carries), //tools:env, //tools:prepare_text (token
# files for model.pretrained runs), //tools/bench:throughput, //tools/bench:pipeline_bubble,
# every test tagged `gpu` and the helpers they start (//tests/integration:ddp_parity_helper,
# cuda_ranks_helper).
# Flags:
#   --out=DIR           (required) output folder; replaced if it exists and holds a MANIFEST.
#   --bazel_flag=FLAG   extra flag for the inner `bazel build` (repeatable), e.g. --bazel_flag=--config=cpu_only
# Exit status: 0 written; 1 build or copy failed; 2 usage error.
set -euo pipefail

usage() { echo "usage: bazel run //tools:bundle -- --out=DIR [--bazel_flag=FLAG ...] [TARGET ...]" >&2; exit 2; }
die() { echo "bundle: $*" >&2; exit 1; }

out=""
bazel_flags=()
targets=()
for arg in "$@"; do
  case "$arg" in
    --out=*) out=${arg#--out=} ;;
    --bazel_flag=*) bazel_flags+=("${arg#--bazel_flag=}") ;;
    --help|-h) usage ;;
    -*) echo "bundle: unknown flag '$arg'" >&2; usage ;;
    *) targets+=("$arg") ;;
  esac
done
[ -n "$out" ] || { echo "bundle: --out=DIR is required" >&2; usage; }

workspace=${BUILD_WORKSPACE_DIRECTORY:-}
[ -n "$workspace" ] || die "run me with 'bazel run //tools:bundle -- ...' (BUILD_WORKSPACE_DIRECTORY is unset)"
# A relative --out is relative to where the user typed the command.
case "$out" in /*) ;; *) out="${BUILD_WORKING_DIRECTORY:-$PWD}/$out" ;; esac
if [ -e "$out" ] && [ ! -f "$out/MANIFEST" ] && [ -n "$(ls -A "$out" 2>/dev/null)" ]; then
  die "$out exists and is not a bundle (no MANIFEST); choose an empty or new folder"
fi
command -v patchelf >/dev/null || die "patchelf is missing: run tools/setup.sh"

cd "$workspace"
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(bazel query --keep_going --noshow_progress \
    'kind("cc_binary", //examples/...) - attr("tags", "\bno_gpu_bundle\b", //examples/...) + //tools:env + //tools:prepare_text + //tools/bench:throughput + //tools/bench:pipeline_bubble + //tests/integration:ddp_parity_helper + //tests/integration:cuda_ranks_helper + attr("tags", "\bgpu\b", tests(//...))' 2>/dev/null | sort)
fi
[ ${#targets[@]} -gt 0 ] || die "no targets to bundle"

echo "bundle: building ${targets[*]}"
# Dynamically linked: statically, every example and tool held its own copy of the libraries (about
# 5 MiB each; the bundle was 62.8 of the 64 MiB a GPU call carries).
bazel_flags=(--dynamic_mode=fully "${bazel_flags[@]}")
bazel build "${bazel_flags[@]}" "${targets[@]}" //tools:install || die "bazel build failed"
bin_root=$(bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp -R configs "$out/configs" 2>/dev/null || mkdir -p "$out/configs"

# Libraries the node provides (LibTorch, the nvidia wheels, glibc and the C++ runtime) stay out.
provided='^(libtorch[a-z_]*|libc10[a-z_]*|libcaffe2_nvrtc|libshm|libgomp|libcu[a-zA-Z]*|libnv[a-zA-Z_]*|libnccl|libcudnn[a-z_]*|libc|libm|libdl|librt|libpthread|libutil|ld-linux-x86-64|libstdc\+\+|libgcc_s|linux-vdso)\.so'

for target in "${targets[@]}"; do
  label=${target#//}
  pkg=${label%%:*}
  name=${label##*:}
  [ "$pkg" != "$label" ] || name=${pkg##*/}
  src="$bin_root/$pkg/$name"
  [ -x "$src" ] || die "$target did not produce an executable at $src (only cc_binary/cc_test targets can be bundled)"
  [ ! -e "$out/bin/$name" ] || die "two targets are named '$name'; bundle them separately"
  cp "$src" "$out/bin/$name"
  chmod u+w "$out/bin/$name"
  # Shared libraries resolved on this machine that the node will not have.
  while read -r lib path; do
    [ -n "$path" ] || continue
    if [[ ! "$lib" =~ $provided ]] && [ ! -e "$out/lib/$lib" ]; then
      cp -L "$path" "$out/lib/$lib"
      chmod u+w "$out/lib/$lib"
    fi
  done < <(ldd "$src" | sed -nE 's/^\s*([^ ]+) => (\/[^ ]+) .*/\1 \2/p')
done

for f in "$out"/bin/* "$out"/lib/*; do
  strip --strip-unneeded "$f" 2>/dev/null || true
  patchelf --set-rpath '$ORIGIN/../lib' "$f"
done

# The installer for CMake and pkg-config consumers on the node (DIR/install.sh PREFIX): its runfiles,
# and the libraries libfabricpp.so needs that the node will not have.
mkdir -p "$out/install/bundled_libs"
cp -RL "$bin_root/tools/install.runfiles/fabricpp/." "$out/install/"
rm -f "$out/install/tools/install"
chmod -R u+w "$out/install"
while read -r lib path; do
  if [ -n "$path" ] && [[ ! "$lib" =~ $provided ]]; then
    cp -L "$path" "$out/install/bundled_libs/$lib"
    chmod u+w "$out/install/bundled_libs/$lib"
    patchelf --set-rpath '$ORIGIN' "$out/install/bundled_libs/$lib"
  fi
done < <(ldd "$out/install/libfabricpp.so" | sed -nE 's/^\s*([^ ]+) => (\/[^ ]+) .*/\1 \2/p')
strip --strip-unneeded "$out/install/libfabricpp.so"
cp tools/packaging/install.sh "$out/install.sh"
chmod +x "$out/install.sh"
cp tools/find_libtorch.sh "$out/find_libtorch.sh"  # sourced by run.sh and install.sh

revision=$("$workspace/tools/bazel/workspace_status.sh" | sed -n 's/^STABLE_FABRIC_REVISION //p')
torch_version=$(sed -n 's/^torch==//p' tools/requirements.txt)
glibc=$(ldd --version | sed -n '1s/.* \([0-9][0-9.]*\)$/\1/p')
cat >"$out/MANIFEST" <<MANIFEST
revision=$revision
torch=$torch_version
glibc=$glibc
bazel_flags=${bazel_flags[*]}
binaries=$(cd "$out/bin" && echo *)
MANIFEST
cp tools/bundle_run.sh "$out/run.sh"
chmod +x "$out/run.sh"
echo "bundle: wrote $out ($(du -sh "$out" | cut -f1)): $(cd "$out/bin" && echo *)"
echo "bundle: on the node: $out/run.sh NAME [ARGS...]   (e.g. run.sh env)"
