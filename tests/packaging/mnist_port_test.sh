#!/usr/bin/env bash
# examples/mnist_port built by CMake against a fresh install, as a library user builds it: the
# Fabric++ port and the plain LibTorch program it came from, on Fashion-MNIST (the
# same IDX format as MNIST). With the same seed, data order (sequential) and optimizer, the port
# ends with bitwise the same weights as the plain loop, also when stopped and resumed inside the
# epoch. Then it trains under ddp, fsdp and ZeRO-1 over 2 CPU processes with checkpoints rotated
# to 2 (fsdp's sharded), to bitwise the same weights, and writes summary.json with the metrics it
# logged. Runs stop at trainer.max_steps (a few dozen of the epoch's 938 steps): what is checked
# holds at any step, and whole epochs made this the slowest test in CI (794 s; now 173-237 s).
source tests/packaging/testing.sh
install_prefix
work="$TEST_TMPDIR/mnist_port"
mkdir -p "$work"
cp -RL examples/mnist_port "$work/src"
chmod -R u+w "$work/src"
work="$work/src"  # the example's folder, as its sweep.yaml expects: build/, data/
out=$(cmake -S "$work" -B "$work/build" -DCMAKE_PREFIX_PATH="$PREFIX;$TORCH_CMAKE" 2>&1 &&
  cmake --build "$work/build" -j2 2>&1); rc=$?
check "the port and the plain program build with CMake (exit $rc: $(tail -n 5 <<<"$out"))" test $rc -eq 0
[ $rc -eq 0 ] || finish

# torch::data::datasets::MNIST reads the four IDX files uncompressed.
mkdir -p "$work/data"
for f in /usr/share/datasets/fashion-mnist/*-ubyte.gz; do
  gzip -dc "$f" >"$work/data/$(basename "$f" .gz)" || fail "cannot decompress $f"
done

cd "$work" || exit 1
steps=120
out=$(build/mnist_plain data --epochs=1 --max_steps=$steps --sequential --save=plain.pt 2>&1); rc=$?
check "plain/mnist.cc trains $steps steps (exit $rc: $(tail -n 2 <<<"$out"))" test $rc -eq 0
out=$(build/mnist data.shuffle=false trainer.max_steps=$steps fabric.accelerator=cpu \
  logging.run_dir=single 2>&1); rc=$?
check "the port trains $steps steps in one process (exit $rc: $(tail -n 2 <<<"$out"))" test $rc -eq 0
# Stopped at step 50 (its last checkpoint), then resumed from it up to the same step.
out=$(build/mnist data.shuffle=false trainer.max_steps=50 fabric.accelerator=cpu \
  logging.run_dir=half 2>&1 &&
  build/mnist data.shuffle=false trainer.max_steps=$steps fabric.accelerator=cpu \
    checkpoint.resume=half/checkpoints/step-00000050.ckpt logging.run_dir=resumed 2>&1); rc=$?
check "the port stops at step 50 and resumes to $steps (exit $rc: $(tail -n 2 <<<"$out"))" test $rc -eq 0
# With dropout: the same initial weights, batches and dropout masks, or it fails.
for run in single resumed; do
  out=$("${PYTHON:-python3}" - $run/weights.pt plain.pt <<'PY' 2>&1
import sys, torch
a = torch.load(sys.argv[1], weights_only=True)
b = torch.load(sys.argv[2], weights_only=False)  # torch::pickle_save's typed dict
differ = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b or not torch.equal(a[k], b[k])]
print(f"bitwise ({len(a)} tensors)" if not differ else "differ: " + ", ".join(differ))
PY
  )
  check "$run: its weights are bitwise the plain loop's ($out)" grep -q '^bitwise' <<<"$out"
done
check "summary.json holds the logged test/accuracy" grep -q '"test/accuracy"' single/summary.json

for strategy in "fabric.strategy=ddp" "fabric.strategy=fsdp" \
  "fabric.strategy=ddp fabric.ddp.shard_optimizer_state=true"; do
  name=$(tr ' =.' '___' <<<"$strategy")
  # shellcheck disable=SC2086  # strategy: one or two KEY=VALUE words
  out=$(build/mnist $strategy fabric.devices=2 fabric.accelerator=cpu trainer.max_steps=60 \
    checkpoint.every_n_steps=20 checkpoint.keep_last=2 logging.run_dir="$name" 2>&1); rc=$?
  check "$strategy over 2 processes with rotated checkpoints (exit $rc: $(tail -n 2 <<<"$out"))" test $rc -eq 0
  kept=$(ls -d "$name"/checkpoints/step-*.ckpt 2>/dev/null | wc -l)
  check "$strategy: 2 checkpoints kept (found $kept)" test "$kept" -eq 2
  check "$strategy: summary.json with test/accuracy" grep -q '"test/accuracy"' "$name/summary.json"
done
# fsdp and ZeRO-1 keep the same arithmetic as ddp (docs/training.md): bitwise the same weights.
for other in fabric_strategy_fsdp fabric_strategy_ddp_fabric_ddp_shard_optimizer_state_true; do
  out=$("${PYTHON:-python3}" "$RUNFILES_ROOT/tools/compare_weights.py" --bitwise \
    fabric_strategy_ddp/weights.pt "$other/weights.pt" 2>&1)
  check "$other ends with bitwise ddp's weights ($out)" grep -q '^bitwise' <<<"$out"
done
kept=$(ls -d fabric_strategy_fsdp/checkpoints/step-*.ckpt/ 2>/dev/null | wc -l)
check "fsdp's checkpoints are folders (sharded)" test "$kept" -eq 2

# The installed sweep tool runs the example's sweep.yaml from elsewhere: runs start in the sweep
# file's folder (build/mnist, data/), and each run's summary.json holds the logged metric.
sed -i 's/^overrides: {/overrides: {trainer.max_steps: 30, /' "$work/sweep.yaml"
out=$(cd / && "$PREFIX/bin/fabric-sweep" --sweep="$work/sweep.yaml" --dir="$work/sweeps/lr" 2>&1); rc=$?
check "PREFIX/bin/fabric-sweep runs the port's sweep.yaml (exit $rc: $(tail -n 3 <<<"$out"))" test $rc -eq 0
check "both runs done, first attempt, test/accuracy a column ($(head -c 300 "$work/sweeps/lr/results.csv"))" \
  test "$(grep -c '^lr=0\.0[15],done,0,1,' "$work/sweeps/lr/results.csv")" -eq 2 -a \
  -n "$(head -n 1 "$work/sweeps/lr/results.csv" | grep -F test/accuracy)"
finish
