#!/usr/bin/env bash
# The CPU-only side of every CUDA guard compiles, without building the CPU-only tree.
#
# Every source file that mentions FABRIC_WITH_CUDA is compiled with -fsyntax-only using the exact
# command line of `bazel build --config=cpu_only` (taken from `bazel aquery`), so the `#else`
# branches are parsed and type-checked as a CPU-only LibTorch user builds them. Linking against the
# CPU part of LibTorch is covered by .ci/run, which runs the two small tests that assert
# build_info().cuda_compiled and libtorch_has_cuda under --config=cpu_only.
#
# Usage: tools/cuda_guards_check.sh [--jobs=N]   (from the workspace; don't run while another
# bazel command uses it). Prints "PASSED cuda_guards_cpu_only:FILE" or "FAILED ..." per file on
# stdout, the compiler's errors on stderr. Exit status: 0 all compiled, 1 one failed, 2 usage or
# bazel aquery failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
jobs=2
for arg in "$@"; do
  case "$arg" in
    --jobs=*) jobs=${arg#--jobs=} ;;
    *) echo "usage: tools/cuda_guards_check.sh [--jobs=N]" >&2; exit 2 ;;
  esac
done

mapfile -t files < <(git grep -l 'FABRIC_WITH_CUDA' -- '*.cc' | sort)
if [ ${#files[@]} -eq 0 ]; then
  echo "FAILED cuda_guards_cpu_only"
  echo "cuda_guards_check: no source mentions FABRIC_WITH_CUDA (run from a git checkout)" >&2
  exit 2
fi
pattern=$(printf '%s|' "${files[@]}" | sed 's/\./\\./g; s/|$//')
# The compile lines -include the precompiled <torch/types.h> (tools/bazel/pch.bzl) as every
# source of the real build does; built here under cpu_only (cached after .ci/run's cpu_only
# tests), GCC loads it instead of parsing LibTorch's headers for each file (-Winvalid-pch says
# when it cannot). Each file's own code and guards are parsed as before.
if ! out=$(bazel build --noshow_progress --config=cpu_only //tools/bazel:torch_pch 2>&1); then
  echo "FAILED cuda_guards_cpu_only"
  echo "cuda_guards_check: building the cpu_only precompiled header failed: $(tail -n 3 <<<"$out")" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if ! bazel aquery --noshow_progress --config=cpu_only \
     "mnemonic('CppCompile', inputs('($pattern)', //...))" --output=jsonproto >"$tmp/aq.json" 2>"$tmp/aq.err"; then
  echo "FAILED cuda_guards_cpu_only"
  echo "cuda_guards_check: bazel aquery failed: $(tail -n 3 "$tmp/aq.err")" >&2
  exit 2
fi
execroot=$(bazel info --config=cpu_only execution_root 2>/dev/null)
# The compile lines run in the execution root, whose links to the sources and to external/NAME
# are only those the last build used: compile from a root of our own that links every top-level
# entry of the workspace, bazel-out and every fetched external repository.
output_base=$(bazel info --config=cpu_only output_base 2>/dev/null)
workspace=$(bazel info workspace 2>/dev/null)
root="$tmp/root"
mkdir -p "$root/external"
for entry in "$workspace"/*; do ln -s "$entry" "$root/"; done
ln -sfn "$execroot/bazel-out" "$root/bazel-out"
for repo in "$output_base"/external/*/; do ln -s "${repo%/}" "$root/external/"; done

# One shell script per file: the compile line with `-c SRC -o OBJ` (and the dependency file)
# replaced by `-fsyntax-only SRC`, without the precompiled header.
python3 - "$tmp" "${files[@]}" <<'PY'
import json, shlex, sys
tmp, wanted = sys.argv[1], set(sys.argv[2:])
actions = json.load(open(f"{tmp}/aq.json")).get("actions", [])
done = set()
for action in actions:
    args = action["arguments"]
    src = args[args.index("-c") + 1]
    if src not in wanted or src in done:
        continue
    done.add(src)
    out, skip = [], 0
    for i, a in enumerate(args):
        if skip:
            skip -= 1
            continue
        if a in ("-c", "-o", "-MF"):
            skip = 1
            continue
        if a == "-MD":
            continue
        out.append(a)
    if "-DFABRIC_WITH_CUDA" in out:
        sys.exit(f"cuda_guards_check: {src} compiles with -DFABRIC_WITH_CUDA under --config=cpu_only")
    name = src.replace("/", "__")
    with open(f"{tmp}/{name}.sh", "w") as f:
        f.write(" ".join(shlex.quote(a) for a in out + ["-fsyntax-only", src]) + "\n")
    with open(f"{tmp}/{name}.pp.sh", "w") as f:  # the preprocessed source, for the result cache
        f.write(" ".join(shlex.quote(a) for a in out + ["-E", "-P", src]) + "\n")
missing = sorted(wanted - done)
for src in missing:  # a guarded file no target compiles is itself a finding
    print(f"cuda_guards_check: no cpu_only compile action for {src}", file=sys.stderr)
sys.exit(1 if missing else 0)
PY
[ $? -eq 0 ] || { echo "FAILED cuda_guards_cpu_only"; exit 2; }

# A file whose compile line, compiler and preprocessed text passed before is not parsed again:
# CUDA_GUARDS_CACHE (default ~/.cache/fabricpp/cuda_guards; empty: no cache) keeps one empty file
# per passed key (-P: no line markers, which name this run's temporary root). Preprocessing the 23
# files took 24 s on 2 vCPUs, their syntax checks 283-308 s without the precompiled header, 119 s with it.
cache=${CUDA_GUARDS_CACHE-$HOME/.cache/fabricpp/cuda_guards}
[ -n "$cache" ] && mkdir -p "$cache"
printf '%s\n' "${files[@]}" | CACHE="$cache" xargs -P "$jobs" -n 1 bash -c '
  script="$0/${2//\//__}.sh"
  key=""
  if [ -n "$CACHE" ]; then
    read -r compiler _ <"$script"
    key=$( { cat "$script"; (cd "$1" && "$compiler" --version && bash "${script%.sh}.pp.sh"); } 2>/dev/null |
      sha256sum | cut -c1-64)
  fi
  if [ -n "$key" ] && [ -e "$CACHE/$key" ]; then
    echo "PASSED cuda_guards_cpu_only:$2"
  elif (cd "$1" && bash "$script") >"$script.log" 2>&1; then
    echo "PASSED cuda_guards_cpu_only:$2"
    [ -n "$key" ] && touch "$CACHE/$key"
  else
    echo "FAILED cuda_guards_cpu_only:$2"
    sed "s|^|  $2: |" "$script.log" | head -n 20 >&2
  fi' "$tmp" "$root" | sort >"$tmp/results"
cat "$tmp/results"
! grep -q '^FAILED' "$tmp/results"
