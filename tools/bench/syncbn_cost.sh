#!/usr/bin/env bash
# SyncBatchNorm's cost on CPU: the main job (ResNet-18 CIFAR, 2 self-launched ranks, batch 64 per
# rank, default thread budget) with fabric.sync_batchnorm true vs false, interleaved, REPS times.
#   tools/bench/syncbn_cost.sh [PRECISION] [STEPS] [REPS] [BINARY...]
# Binaries default to bazel-bin/examples/cifar10 (build it first: bazel build //examples:cifar10).
# Prints one line per run (binary, sync_batchnorm, images/s from summary.json) and the medians.
set -euo pipefail
precision=${1:-32-true}
steps=${2:-12}
reps=${3:-3}
shift $(($# < 3 ? $# : 3))
binaries=("$@")
[ ${#binaries[@]} -eq 0 ] && binaries=(bazel-bin/examples/cifar10)
export FABRIC_CONFIG_DIR=${FABRIC_CONFIG_DIR:-$PWD/configs}  # binaries copied out of bazel-bin
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for rep in $(seq "$reps"); do
  for bin in "${binaries[@]}"; do
    for sync in true false; do
      summary=$("$bin" --config=ddp_amp.yaml fabric.precision="$precision" \
        fabric.sync_batchnorm="$sync" trainer.max_steps="$steps" trainer.limit_eval_batches=1 \
        checkpoint.every_n_epochs=0 checkpoint.save_last=false checkpoint.export_weights=none \
        logging.run_dir="$out/run" 2>/dev/null | tail -1)
      ips=$(python3 -c "import json,sys; print('%.1f' % json.load(open(sys.argv[1]))['images_per_second'])" "$summary")
      echo "$bin sync_batchnorm=$sync $ips img/s"
      echo "$bin $sync $ips" >>"$out/all"
      rm -rf "$out/run"
    done
  done
done
echo "medians ($precision, $steps steps, $reps reps):"
python3 - "$out/all" <<'PY'
import statistics, sys, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    b, s, v = line.split()
    runs[(b, s)].append(float(v))
for b in dict.fromkeys(k[0] for k in runs):
    on, off = statistics.median(runs[(b, "true")]), statistics.median(runs[(b, "false")])
    print(f"{b}: SyncBN {on:.1f} img/s, BatchNorm {off:.1f} img/s, SyncBN costs {100 * (1 - on / off):.1f}% of throughput")
PY
