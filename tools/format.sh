#!/usr/bin/env bash
# tools/format.sh: formats the tree's C++ with the clang-format that tools/setup.sh installs
# (Debian's clang-format-14, pinned there) under .clang-format (Google style, 100 columns).
#   tools/format.sh            rewrites every tracked .h/.cc/.cu/.cuh file in place
#   tools/format.sh --check    changes nothing; lists the files that differ (CI: tools/ci_checks.sh)
#   tools/format.sh FILE...    formats just those of them that are C++ (others named, skipped)
# Environment: CLANG_FORMAT (default clang-format-14) is the binary.
# Exit status: 0 formatted or clean; 1 with --check when a file differs (the files are named);
#              2 clang-format not found (run tools/setup.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
command -v "$CLANG_FORMAT" >/dev/null ||
  { echo "format.sh: $CLANG_FORMAT not found; run tools/setup.sh (Debian package clang-format-14)" >&2; exit 2; }
check=0
if [ "${1:-}" = --check ]; then check=1; shift; fi
if [ $# -gt 0 ]; then
  files=()
  for f in "$@"; do  # only C++: clang-format would rewrite a BUILD file as if it were C++
    case "$f" in
      *.h | *.cc | *.cu | *.cuh) files+=("$f") ;;
      *) echo "format.sh: $f skipped (not .h/.cc/.cu/.cuh)" >&2 ;;
    esac
  done
  [ ${#files[@]} -gt 0 ] || exit 0
else
  mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh')
fi
if [ $check -eq 0 ]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit $?
fi
differ=()
for f in "${files[@]}"; do
  "$CLANG_FORMAT" --dry-run -Werror "$f" >/dev/null 2>&1 || differ+=("$f")
done
if [ ${#differ[@]} -gt 0 ]; then
  echo "format.sh: ${#differ[@]} file(s) differ from .clang-format: ${differ[*]}; fix: tools/format.sh ${differ[*]}"
  exit 1
fi
echo "format.sh: ${#files[@]} files clean"
