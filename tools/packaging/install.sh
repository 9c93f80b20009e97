#!/usr/bin/env bash
# bazel run //tools:install -- PREFIX            (add --config=cpu_only to install the CPU-only build)
# DIR/install.sh PREFIX                          (from a bundle, bazel run //tools:bundle: on a node
#                                                 without Bazel; LibTorch is then the node's, found
#                                                 like DIR/run.sh finds it, and must be the version
#                                                 the bundle was built against)
#
# Installs Fabric++ for CMake and pkg-config consumers (docs/building.md, "Use it in your project"):
#   PREFIX/include/fabricpp/      the public headers: fabric/all.h, fabric/models/gpt.h,
#                                 fabric/data/tokens.h, fabric/data/bpe.h and every header of this
#                                 project they include, nothing else (#include "fabric/all.h"
#                                 with -I PREFIX/include/fabricpp)
#   PREFIX/lib/libfabricpp.so.X.Y.Z   one shared library (soname libfabricpp.so.X, links
#                                 libfabricpp.so.X and libfabricpp.so beside it); its run path is the
#                                 LibTorch folders the build found (tools/bazel/libtorch_configure.bzl)
#   PREFIX/lib/cmake/FabricPP/    FabricPPConfig.cmake + FabricPPConfigVersion.cmake:
#                                 find_package(FabricPP) gives the target FabricPP::fabric
#   PREFIX/lib/pkgconfig/fabricpp.pc
#
# A second install into the same PREFIX replaces the first one's files (stale headers included) and
# touches nothing else there.
# Exit status: 0 installed; 1 a file could not be written or the build's LibTorch is gone; 2 usage.
set -euo pipefail

usage() { echo "usage: bazel run //tools:install -- PREFIX" >&2; exit 2; }
die() { echo "install: $*" >&2; exit 1; }

prefix=""
for arg in "$@"; do
  case "$arg" in
    --help|-h) usage ;;
    -*) echo "install: unknown flag '$arg'" >&2; usage ;;
    *) [ -z "$prefix" ] || { echo "install: one PREFIX only (got '$prefix' and '$arg')" >&2; usage; }
       prefix=$arg ;;
  esac
done
[ -n "$prefix" ] || { echo "install: PREFIX is required" >&2; usage; }
# A relative PREFIX is relative to where the user typed the command.
case "$prefix" in /*) ;; *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;; esac

# The files come from this script's runfiles (the working directory under `bazel run` and in
# tests) or, in a bundle, from DIR/install/ beside DIR/install.sh.
here=""
for candidate in "$PWD" "${RUNFILES_DIR:-$0.runfiles}/fabricpp" "$(dirname "$0")/install"; do
  if [ -f "$candidate/tools/packaging/install_facts.sh" ]; then here=$candidate; break; fi
done
[ -n "$here" ] ||
  die "cannot find the build's files beside $0; run me with 'bazel run //tools:install -- PREFIX'"

# FABRIC_VERSION FABRIC_SOVERSION LIBTORCH_PATH LIBTORCH_VERSION WITH_CUDA DEFINES RUNTIME_LIB_DIRS
source "$here/tools/packaging/install_facts.sh"
bundled=""
if [ -d "$here/bundled_libs" ]; then
  # From a bundle: the node's LibTorch, and the Debian libraries the bundle carries.
  bundled=1
  source "$(dirname "$0")/find_libtorch.sh"
  find_libtorch "$LIBTORCH_VERSION" || die "$LIBTORCH_ERROR"
  LIBTORCH_PATH=$(cd "$LIBTORCH" && pwd -P)
  found=$(sed -n 's/^#define TORCH_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' \
    "$LIBTORCH_PATH/include/torch/headeronly/version.h" 2>/dev/null | paste -sd.)
  [ "$found" = "$LIBTORCH_VERSION" ] ||
    die "the bundle was built against LibTorch $LIBTORCH_VERSION but $LIBTORCH_PATH is LibTorch ${found:-of unknown version}; install torch==$LIBTORCH_VERSION or rebuild the bundle"
  RUNTIME_LIB_DIRS="\$ORIGIN:$LIBTORCH_LIB_DIRS"
else
  [ -f "$LIBTORCH_PATH/lib/libtorch_cpu.so" ] ||
    die "the LibTorch this build was made with is gone from $LIBTORCH_PATH; rebuild (bazel clean; tools/setup.sh)"
fi
command -v patchelf >/dev/null || die "patchelf is missing: run tools/setup.sh"

# --- Public headers: the closure of fabric/all.h and of //:gpt's three over "..." includes ------------
declare -A available=()
while read -r h; do available[$h]=1; done <"$here/tools/packaging/project_headers.txt"
declare -A public=()
queue=(fabric/all.h fabric/models/gpt.h fabric/data/tokens.h fabric/data/bpe.h)
while [ ${#queue[@]} -gt 0 ]; do
  h=${queue[0]}
  queue=("${queue[@]:1}")
  [ -z "${public[$h]:-}" ] || continue
  [ -n "${available[$h]:-}" ] || die "the public headers reach $h, which is not among //:installed's headers"
  public[$h]=1
  while read -r inc; do
    [ -n "${available[$inc]:-}" ] && queue+=("$inc")
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$here/$h")
done

# --- Write -----------------------------------------------------------------------------------------
lib="libfabricpp.so.$FABRIC_VERSION"
mkdir -p "$prefix/include" "$prefix/lib/cmake/FabricPP" "$prefix/lib/pkgconfig" 2>/dev/null ||
  die "cannot create folders under $prefix (permissions? choose a PREFIX you can write)"
rm -rf "$prefix/include/fabricpp"
for h in "${!public[@]}"; do
  install -D -m 644 "$here/$h" "$prefix/include/fabricpp/$h"
done
install -m 755 "$here/libfabricpp.so" "$prefix/lib/$lib.tmp"
patchelf --set-rpath "$RUNTIME_LIB_DIRS" "$prefix/lib/$lib.tmp"
mv -f "$prefix/lib/$lib.tmp" "$prefix/lib/$lib"
ln -sfn "$lib" "$prefix/lib/libfabricpp.so.$FABRIC_SOVERSION"
ln -sfn "libfabricpp.so.$FABRIC_SOVERSION" "$prefix/lib/libfabricpp.so"
# The sweep tool (no LibTorch in it): PREFIX/bin/fabric-sweep, its Optuna bridge in share/.
if [ -f "$here/tools/sweep/fabric-sweep" ]; then
  mkdir -p "$prefix/bin" "$prefix/share/fabricpp"
  install -m 755 "$here/tools/sweep/fabric-sweep" "$prefix/bin/fabric-sweep.tmp"
  mv -f "$prefix/bin/fabric-sweep.tmp" "$prefix/bin/fabric-sweep"
  install -m 644 "$here/tools/sweep/optuna_bridge.py" "$prefix/share/fabricpp/optuna_bridge.py"
fi
if [ -n "$bundled" ]; then
  for dep in "$here"/bundled_libs/*; do
    [ -e "$dep" ] && install -m 755 "$dep" "$prefix/lib/"
  done
fi

if [ "$WITH_CUDA" = 1 ]; then
  kind=CUDA; with_cuda_cmake=TRUE
  torch_libs="-Wl,--push-state,--no-as-needed -ltorch_cuda -Wl,--pop-state -lc10_cuda -ltorch_cpu -lc10"
else
  kind=cpu_only; with_cuda_cmake=FALSE
  torch_libs="-ltorch_cpu -lc10"
fi
defines_flags=$(sed 's/\([^ ]*\)/-D\1/g' <<<"$DEFINES")
# Replaces every @NAME@ of a template; the values hold no '|'.
fill() {
  sed -e "s|@FABRIC_VERSION@|$FABRIC_VERSION|g" -e "s|@FABRIC_SOVERSION@|$FABRIC_SOVERSION|g" \
      -e "s|@LIBTORCH_VERSION@|$LIBTORCH_VERSION|g" -e "s|@LIBTORCH_PATH@|$LIBTORCH_PATH|g" \
      -e "s|@BUILD_KIND@|$kind|g" -e "s|@WITH_CUDA_CMAKE@|$with_cuda_cmake|g" \
      -e "s|@DEFINES_CMAKE@|${DEFINES// /;}|g" -e "s|@DEFINES_FLAGS@|$defines_flags|g" \
      -e "s|@TORCH_LIBS@|$torch_libs|g" -e "s|@PREFIX@|$prefix|g" "$1" >"$2"
}
fill "$here/tools/packaging/FabricPPConfig.cmake.in" "$prefix/lib/cmake/FabricPP/FabricPPConfig.cmake"
fill "$here/tools/packaging/FabricPPConfigVersion.cmake.in" "$prefix/lib/cmake/FabricPP/FabricPPConfigVersion.cmake"
fill "$here/tools/packaging/fabricpp.pc.in" "$prefix/lib/pkgconfig/fabricpp.pc"

size=$(du -m "$prefix/lib/$lib" | cut -f1)
echo "installed Fabric++ $FABRIC_VERSION ($kind build, LibTorch $LIBTORCH_VERSION) into $prefix:" \
     "${#public[@]} headers, lib/$lib (${size} MB)"
echo "  CMake:      find_package(FabricPP REQUIRED) with CMAKE_PREFIX_PATH=\"$prefix;\$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')\""
echo "  pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs fabricpp"
if [ -x "$prefix/bin/fabric-sweep" ]; then
  echo "  sweeps:     $prefix/bin/fabric-sweep --sweep=FILE (docs/experiments.md)"
fi
