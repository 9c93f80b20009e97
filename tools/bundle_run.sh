#!/usr/bin/env bash
# run.sh NAME [ARGS...]: runs bin/NAME of this bundle against the node's LibTorch.
#   run.sh --list     lists the binaries.
#
# LibTorch is found from LIBTORCH_HOME (a LibTorch folder or site-packages/torch), else from
# `python3 -c "import torch"` (PYTHON overrides the interpreter). Its lib/ and the nvidia wheels'
# lib/ folders beside it go on LD_LIBRARY_PATH, after this bundle's own lib/.
# FABRIC_CONFIG_DIR is set to this bundle's configs/ (config files are looked up there last).
# Exit status: the binary's own; 127 when LibTorch or the binary cannot be found or cannot run here.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
die() { echo "run.sh: $*" >&2; exit 127; }

manifest() { sed -n "s/^$1=//p" "$here/MANIFEST"; }

if [ $# -eq 0 ] || [ "$1" = --list ] || [ "$1" = --help ]; then
  echo "usage: $0 NAME [ARGS...]; binaries: $(manifest binaries)"
  [ $# -gt 0 ] && exit 0 || exit 2
fi
name=$1
shift
[ -x "$here/bin/$name" ] || die "no binary '$name' in this bundle; have: $(manifest binaries)"

source "$here/find_libtorch.sh"
find_libtorch "$(manifest torch)" || die "$LIBTORCH_ERROR"

# Binaries were linked against this glibc; an older one fails with cryptic symbol errors.
need=$(manifest glibc)
have=$(ldd --version 2>/dev/null | sed -n '1s/.* \([0-9][0-9.]*\)$/\1/p')
if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1)" != "$need" ]; then
  die "this node has glibc $have but the bundle needs >= $need; build the bundle on an older distribution"
fi

libs="$here/lib:$LIBTORCH_LIB_DIRS"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export FABRIC_CONFIG_DIR="${FABRIC_CONFIG_DIR:-$here/configs}"
exec "$here/bin/$name" "$@"
