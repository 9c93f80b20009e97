# Sourced by the tests of //tests/packaging. Offers:
#   check DESCRIPTION COMMAND...   runs the command; counts a failure when it fails
#   fail MESSAGE / finish          count a failure / exit 0 or 1 with the count
#   install_prefix                 installs this build into a fresh $PREFIX (tools/install)
#   run_readme_snippet NAME DIR    runs the README block after `<!-- snippet: NAME -->` verbatim in
#                                  DIR (a copy of examples/cmake_consumer inside), with HOME=DIR,
#                                  `bazel run //tools:install --` answered by this build's installer
#                                  and `python3` by $PYTHON (the interpreter with LibTorch's torch);
#                                  its output goes to stdout, its exit status is returned
# and the facts of tools/packaging/install_facts.sh (FABRIC_VERSION, LIBTORCH_PATH, WITH_CUDA, ...).
set -uo pipefail
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
check() {
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else fail "$what"; fi
}
finish() {
  if [ "$failures" -eq 0 ]; then echo "all checks passed"; exit 0; fi
  echo "$failures check(s) failed" >&2; exit 1
}

source tools/packaging/install_facts.sh
RUNFILES_ROOT=$PWD
TORCH_CMAKE="$LIBTORCH_PATH/share/cmake"

install_prefix() {
  PREFIX="$TEST_TMPDIR/prefix"
  rm -rf "$PREFIX"
  if ! tools/install "$PREFIX" >"$TEST_TMPDIR/install.log" 2>&1; then
    cat "$TEST_TMPDIR/install.log" >&2
    echo "FAIL: bazel run //tools:install -- PREFIX failed" >&2
    exit 1
  fi
  export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
}

# check_rotated_checkpoints DIR PROGRAM: PROGRAM (examples/cmake_consumer's ddp_train, run in DIR)
# under fsdp and under ZeRO-1 over 2 ranks, a checkpoint every 4 steps of 32 and 2 kept: no crash
# (deleting a sharded checkpoint once crashed CMake builds: docs/building.md), replicas identical,
# 2 checkpoints left, fsdp's sharded (folders).
check_rotated_checkpoints() {
  local dir=$1 program=$2 strategy name out rc kept
  for strategy in "fabric.strategy=fsdp" "fabric.strategy=ddp fabric.ddp.shard_optimizer_state=true"; do
    name=${strategy##*=}
    # shellcheck disable=SC2086  # strategy: one or two KEY=VALUE words
    out=$(cd "$dir" && "$program" $strategy fabric.devices=2 fabric.accelerator=cpu \
      trainer.max_epochs=2 checkpoint.every_n_steps=4 checkpoint.keep_last=2 \
      logging.run_dir="run_$name" 2>&1); rc=$?
    # 2 epochs train to ~0.55 accuracy (exit 1 says below 0.9); a crash is 128 + its signal.
    check "$strategy with rotated checkpoints ends without a crash (got $rc: $(tail -n 3 <<<"$out"))" \
      test $rc -le 1
    check "$strategy: replicas identical" grep -q '^ranks 2: replicas identical' <<<"$out"
    kept=$(ls -d "$dir/run_$name"/checkpoints/step-*.ckpt 2>/dev/null | wc -l)
    check "$strategy: 2 checkpoints kept of 8 (found $kept)" test "$kept" -eq 2
  done
  kept=$(ls -d "$dir"/run_fsdp/checkpoints/step-*.ckpt/ 2>/dev/null | wc -l)
  check "fsdp's are folders (sharded)" test "$kept" -eq 2
}

run_readme_snippet() {
  local name=$1 dir=$2 script
  script=$(awk -v want="<!-- snippet: $name -->" '
    $0 == want { armed = 1; next }
    armed && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' README.md)
  [ -n "$script" ] || { echo "README.md has no block after '<!-- snippet: $name -->'" >&2; return 1; }
  mkdir -p "$dir/examples"
  cp -RL examples/cmake_consumer "$dir/examples/"
  (
    cd "$dir" || exit 1
    export HOME=$dir
    bazel() {
      [ "$1 $2 $3" = "run //tools:install --" ] || { echo "snippet runs 'bazel $*': not emulated" >&2; return 1; }
      shift 3
      "$RUNFILES_ROOT/tools/install" "$@"
    }
    python3() { "${PYTHON:-python3}" "$@"; }
    set -e
    eval "$script"
  )
}
