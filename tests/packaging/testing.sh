# Sourced by the tests of //tests/packaging: installs this build into a fresh prefix and offers
# check/fail helpers. Sets PREFIX and the facts of tools/packaging/install_facts.sh.
set -uo pipefail
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
check() {  # check DESCRIPTION COMMAND...: runs the command, counts a failure when it fails
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else fail "$what"; fi
}
finish() {
  if [ "$failures" -eq 0 ]; then echo "all checks passed"; exit 0; fi
  echo "$failures check(s) failed" >&2; exit 1
}

source tools/packaging/install_facts.sh
PREFIX="$TEST_TMPDIR/prefix"
rm -rf "$PREFIX"
if ! tools/install "$PREFIX" >"$TEST_TMPDIR/install.log" 2>&1; then
  cat "$TEST_TMPDIR/install.log" >&2
  echo "FAIL: bazel run //tools:install -- PREFIX failed" >&2
  exit 1
fi
TORCH_CMAKE="$LIBTORCH_PATH/share/cmake"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
