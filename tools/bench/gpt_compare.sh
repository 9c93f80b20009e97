#!/usr/bin/env bash
# GPT training throughput side by side on one device: ours (tools/bench/throughput.cc --model=gpt2,
# eager, with fabric.cuda_graphs, and eager with ATen's LayerNorm instead of our fused kernels:
# --fused_layer_norm=false) against the identical model in PyTorch
# (tools/bench/gpt_reference.py, eager and torch.compile), repetitions interleaved, medians.
#
#   gpt_compare.sh THROUGHPUT_BIN GPT_REFERENCE_PY OUT_DIR [--reps=2] [--steps=40] [--warmup=15]
#                  [--model=gpt2] [--batch=16] [--precision=bf16-mixed] [--device=cuda]
#
# Writes OUT_DIR/results.jsonl (every RESULT line), OUT_DIR/table.md (median tokens/s, MFU and
# step time per side, the ratio to PyTorch eager) and, from one extra profiled run of ours,
# OUT_DIR/trace_summary.txt (where the step's time goes; tools/bench/trace_summary.py beside
# GPT_REFERENCE_PY) and trace_summary_pytorch.txt (the same for PyTorch eager). gpu_check.sh's bundle carries all three files (bench/).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: gpt_compare.sh THROUGHPUT_BIN GPT_REFERENCE_PY OUT_DIR [flags]" >&2; exit 2; }
bin=$1 ref=$2 out=$3
shift 3
reps=2 steps=40 warmup=15 model=gpt2 batch=16 precision=bf16-mixed device=cuda
for arg in "$@"; do
  case "$arg" in
    --reps=*) reps=${arg#--reps=} ;;
    --steps=*) steps=${arg#--steps=} ;;
    --warmup=*) warmup=${arg#--warmup=} ;;
    --model=*) model=${arg#--model=} ;;
    --batch=*) batch=${arg#--batch=} ;;
    --precision=*) precision=${arg#--precision=} ;;
    --device=*) device=${arg#--device=} ;;
    *) echo "gpt_compare.sh: unknown flag '$arg'" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
mkdir -p "$out" || exit 1
results="$out/results.jsonl"
: >"$results"
common=(--model="$model" --batch="$batch" --steps="$steps" --warmup="$warmup" --precision="$precision")
failed=0
# side NAME COMMAND...: one run; its RESULT line goes to results.jsonl with "side": NAME.
side() {
  local name=$1 log
  shift
  log="$out/$name.log"
  echo "gpt_compare: $name ..." >&2
  if timeout --kill-after=10 300 "$@" >>"$log" 2>&1; then
    grep '^RESULT ' "$log" | tail -n 1 | sed "s/^RESULT {/{\"side\": \"$name\", /" >>"$results"
  else
    echo "gpt_compare: $name failed (exit $?; $log)" >&2
    tail -n 5 "$log" >&2
    failed=1
  fi
}
for ((r = 1; r <= reps; r++)); do
  side ours-eager "$bin" "${common[@]}" --accelerator="$device"
  side pytorch-eager "$python" "$ref" "${common[@]}" --device="$device" --mode=eager
  side ours-graphs "$bin" "${common[@]}" --accelerator="$device" --cuda_graphs
  side ours-aten-layernorm "$bin" "${common[@]}" --accelerator="$device" --fused_layer_norm=false
  side pytorch-compile "$python" "$ref" "${common[@]}" --device="$device" --mode=compile
done
# Where each side spends a step (8 profiled steps after the timed ones start).
"$bin" "${common[@]}" --accelerator="$device" --profile="$out/ours_trace.json" --profile_steps=8 \
  >"$out/profile.log" 2>&1 &&
  "$python" "$(dirname "$ref")/trace_summary.py" --top=25 "$out/ours_trace.json" >"$out/trace_summary.txt" 2>&1
"$python" "$ref" "${common[@]}" --device="$device" --mode=eager --profile="$out/pytorch_trace.json" \
  --profile_steps=8 >"$out/profile_pytorch.log" 2>&1 &&
  "$python" "$(dirname "$ref")/trace_summary.py" --top=25 "$out/pytorch_trace.json" \
    >"$out/trace_summary_pytorch.txt" 2>&1
rm -f "$out/ours_trace.json" "$out/pytorch_trace.json"
"$python" - "$results" >"$out/table.md" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
by = {}
for r in rows:
    by.setdefault(r["side"], []).append(r)
med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in by.items()}
base = med.get("pytorch-eager")
print("| side | runs | tokens/s (median) | MFU | step ms | peak MiB | vs PyTorch eager |")
print("|---|---|---|---|---|---|---|")
for k in ["ours-eager", "ours-graphs", "ours-aten-layernorm", "pytorch-eager", "pytorch-compile"]:
    if k not in by:
        continue
    v = by[k]
    m = med[k]
    mfu = statistics.median(r["mfu"] for r in v)
    ms = statistics.median(r["step_ms"] for r in v)
    peak = max(r["peak_device_mib"] for r in v)
    ratio = f"{m / base:.3f}x" if base else "-"
    print(f"| {k} | {len(v)} | {m:,.0f} | {100 * mfu:.1f}% | {ms:.2f} | {peak:,.0f} | {ratio} |")
print()
print("runs: " + "; ".join(f"{r['side']} {r['tokens_per_s']:,.0f}" for r in rows))
PY
cat "$out/table.md"
exit $failed
