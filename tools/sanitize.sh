#!/usr/bin/env bash
# Runs the test suite (or the given targets) under a sanitizer, our code instrumented:
#   tools/sanitize.sh asan [targets...]   AddressSanitizer + LeakSanitizer (LibTorch's own leaks
#                                         suppressed by tests/fuzz/lsan.supp)
#   tools/sanitize.sh tsan [targets...]   ThreadSanitizer (suppressions: tests/tsan.supp)
# Default targets: //... . Extra bazel flags: SANITIZE_FLAGS="...". Exit status: bazel's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
kind=${1:?usage: tools/sanitize.sh asan|tsan [targets...]}
shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(//...)
case "$kind" in
  asan)
    exec bazel test --config=asan ${SANITIZE_FLAGS:-} \
      --test_env=ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1 \
      --test_env=LSAN_OPTIONS=suppressions=$PWD/tests/fuzz/lsan.supp:print_suppressions=0 \
      "${targets[@]}" ;;
  tsan)
    exec bazel test --config=tsan ${SANITIZE_FLAGS:-} \
      --test_env=TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp \
      "${targets[@]}" ;;
  *) echo "tools/sanitize.sh: unknown sanitizer '$kind' (expected asan or tsan)" >&2; exit 2 ;;
esac
