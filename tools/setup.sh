#!/usr/bin/env bash
# tools/setup.sh: installs everything the build needs on a Debian 12 machine; idempotent and
# non-interactive. A second run with everything present changes nothing and takes about a second.
#
#   Debian packages: Bazel (bazel-bootstrap), yaml-cpp, glog, gflags, GoogleTest/GoogleMock,
#                    Google Benchmark, zlib, nlohmann-json, patchelf, the Fashion-MNIST dataset,
#                    CMake, make and pkg-config (the consumers of an installed Fabric++),
#                    clang and clang-format-14 (fuzzers, tools/format.sh).
#   PyPI:            tools/requirements.txt (torch, pinned there and only there).
#
# Environment: PYTHON (default python3) is the interpreter whose site-packages receives torch;
#              the LibTorch repository rule finds it through `python3 -c "import torch"`.
# Exit status: 0 on success; 1 with one line "setup.sh: ..." naming the package that could not be
#              had (registry unreachable, package unknown, no root).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
start_ms=$(($(date +%s%N) / 1000000))

DEBIAN_PACKAGES=(
  bazel-bootstrap        # Bazel 4.2.3 (brings a JDK)
  g++
  binutils               # nm: the LibTorch rule reads libc10.so's ABI from its symbols
  libyaml-cpp-dev
  libgoogle-glog-dev
  libgflags-dev
  libgtest-dev
  libgmock-dev
  libbenchmark-dev
  zlib1g-dev
  libjpeg62-turbo-dev    # JPEG decoding (libjpeg-turbo) for data.format: image_folder
  libpng-dev             # PNG decoding
  nlohmann-json3-dev     # JSON output (env report, summaries, benchmarks)
  patchelf               # relocatable bundles (tools/bundle.sh)
  dataset-fashion-mnist  # /usr/share/datasets/fashion-mnist
  iproute2               # ip netns: //tests/integration:netns_test's two "nodes"
  openmpi-bin            # mpirun: //tests/integration:launchers_test starts real MPI jobs
  slurm-wlm              # srun/sbatch on a one-machine cluster (tools/slurm_local.sh, launchers_test)
  clang                  # --config=fuzz (libFuzzer harnesses in tests/fuzz/)
  libclang-rt-14-dev     # libFuzzer and the sanitizer runtimes for clang 14
  clang-format-14        # tools/format.sh and its CI check (pinned: formatting differs by version)
  cmake                  # //tests/packaging: the CMake consumer of an installed Fabric++
  make
  pkgconf                # pkg-config: //tests/packaging:pkg_config_test
)

die() { echo "setup.sh: $*" >&2; exit 1; }

# --- Debian packages ---------------------------------------------------------------------------
missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$pkg")
done

apt_install() {
  local log
  log=$(mktemp)
  if DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "$@" >"$log" 2>&1; then
    rm -f "$log"; return 0
  fi
  # Name the package that could not be had: an unknown name, or the .deb whose download failed.
  local unknown fetch
  unknown=$(sed -n 's/^E: Unable to locate package \(.*\)$/\1/p' "$log" | head -n1)
  fetch=$(sed -n 's|^E: Failed to fetch .*/\([^/_]*\)_[^/]*\.deb.*$|\1|p' "$log" | head -n1)
  if [ -n "$unknown" ]; then
    echo "unknown:$unknown"
  elif [ -n "$fetch" ]; then
    echo "fetch:$fetch"
  else
    echo "other:$(grep -m1 '^E:' "$log" || tail -n1 "$log")"
  fi
  rm -f "$log"
  return 1
}

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "need root to install Debian packages: ${missing[*]} (run as root or install sudo)"
    SUDO="sudo -n"
  fi
  echo "setup.sh: installing Debian packages: ${missing[*]}"
  if ! err=$(apt_install "${missing[@]}"); then
    # Stale or empty package lists are the usual cause: refresh once, then retry.
    if ! $SUDO apt-get update -q >/dev/null 2>&1; then
      die "could not reach the Debian registry to install '${missing[0]}' (apt-get update failed; check network/proxy)"
    fi
    if ! err=$(apt_install "${missing[@]}"); then
      case "$err" in
        unknown:*) die "Debian package '${err#unknown:}' not found in the configured registry" ;;
        fetch:*)   die "could not download Debian package '${err#fetch:}' (registry unreachable?)" ;;
        *)         die "apt-get failed installing ${missing[*]}: ${err#other:}" ;;
      esac
    fi
  fi
fi

# --- PyPI ----------------------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null || die "no '$PYTHON' on PATH: install python3 (with pip) or set PYTHON"
requirements=tools/requirements.txt
py_missing=$("$PYTHON" - "$requirements" <<'PY'
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    req = line.split("#", 1)[0].strip()
    if not req:
        continue
    name, _, version = req.partition("==")
    try:
        if md.version(name) == version:
            continue
    except md.PackageNotFoundError:
        pass
    print(req)
PY
)
if [ -n "$py_missing" ]; then
  echo "setup.sh: installing from PyPI: $(echo $py_missing)"
  "$PYTHON" -m pip --version >/dev/null 2>&1 || die "'$PYTHON -m pip' is not available: install pip for $PYTHON"
  for req in $py_missing; do
    log=$(mktemp)
    if ! "$PYTHON" -m pip install --quiet --disable-pip-version-check "$req" >"$log" 2>&1; then
      reason=$(grep -m1 -E '^ERROR:' "$log" || tail -n1 "$log")
      rm -f "$log"
      case "$reason" in *"from versions: none"*) reason="$reason (is PyPI reachable?)" ;; esac
      die "could not install '$req' from PyPI: ${reason#ERROR: }"
    fi
    rm -f "$log"
  done
fi

elapsed_ms=$(($(date +%s%N) / 1000000 - start_ms))
torch_version=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))')
echo "setup.sh: ready (${#DEBIAN_PACKAGES[@]} Debian packages, torch ${torch_version}, $((elapsed_ms / 1000)).$((elapsed_ms % 1000 / 100))s)"
