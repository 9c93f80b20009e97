#!/usr/bin/env bash
# GPT training throughput side by side on one device, repetitions interleaved, medians. Sides:
#   ours-eager           tools/bench/throughput.cc --model=MODEL (fused loss and LayerNorm)
#   ours-graphs          the same with fabric.cuda_graphs
#   ours-aten-layernorm  ours with ATen's LayerNorm (--fused_layer_norm=false)
#   ours-fp8             ours with --precision=fp8-mixed (float8 GEMMs, tensorwise scales)
#   ours-fp8-rowwise     the same with --fp8_recipe=rowwise
#   ours-fp8-delayed     the same with --fp8_recipe=delayed (scales from a 16-step amax history)
#   ours-fp8-delayed-tilegrid  ours-fp8-delayed with FABRIC_FP8_CAST_GRID=tile (the cast kernels'
#                        grid before 2026-11-30: a block per tile)
#   ours-fp8-graphs, ours-fp8-delayed-graphs
#                        ours-fp8 and ours-fp8-delayed with fabric.cuda_graphs (against ours-graphs)
#   ours-fp8-auto        ours-fp8 with --fp8_exclude=auto_filter_small_kn (the Linear layers
#                        torchao's heuristic finds too small to gain stay bf16)
#   ours-fp8-precise     ours-fp8 with --fp8_fast_accumulation=false (every GEMM accumulates
#                        precisely, as before 2026-11-29)
#   OURS-accum4          side OURS (any ours-*) with --accumulate=4: 4 micro-batches of --batch
#                        per optimizer step (gradient accumulation; tokens/s counts all four)
#   OURS-accum4-nocache  the same with --fp8_weight_cache=false (every micro-batch casts the
#                        weights to float8 again: what the kept casts give)
#   pytorch-eager        the identical model in PyTorch (tools/bench/gpt_reference.py)
#   pytorch-compile      the same under torch.compile
#
#   gpt_compare.sh THROUGHPUT_BIN GPT_REFERENCE_PY OUT_DIR [--reps=2] [--steps=40] [--warmup=15]
#                  [--model=gpt2] [--batch=16] [--precision=bf16-mixed] [--device=cuda]
#                  [--sides=ours-eager,pytorch-eager,ours-graphs,ours-aten-layernorm,pytorch-compile]
#                  [--base=pytorch-eager] [--profile=ours-eager,pytorch-eager]
#
# Writes OUT_DIR/results.jsonl (every RESULT line), OUT_DIR/table.md (median tokens/s, MFU and
# step time per side, the ratio to --base) and, from one extra profiled run of each --profile
# side, OUT_DIR/trace_summary.txt (the first; tools/bench/trace_summary.py beside
# GPT_REFERENCE_PY) and trace_summary_pytorch.txt (pytorch-eager's). gpu_check.sh's bundle
# carries all three files (bench/).
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: gpt_compare.sh THROUGHPUT_BIN GPT_REFERENCE_PY OUT_DIR [flags]" >&2; exit 2; }
bin=$1 ref=$2 out=$3
shift 3
reps=2 steps=40 warmup=15 model=gpt2 batch=16 precision=bf16-mixed device=cuda
sides=ours-eager,pytorch-eager,ours-graphs,ours-aten-layernorm,pytorch-compile
base=pytorch-eager profile=ours-eager,pytorch-eager
for arg in "$@"; do
  case "$arg" in
    --reps=*) reps=${arg#--reps=} ;;
    --steps=*) steps=${arg#--steps=} ;;
    --warmup=*) warmup=${arg#--warmup=} ;;
    --model=*) model=${arg#--model=} ;;
    --batch=*) batch=${arg#--batch=} ;;
    --precision=*) precision=${arg#--precision=} ;;
    --device=*) device=${arg#--device=} ;;
    --sides=*) sides=${arg#--sides=} ;;
    --base=*) base=${arg#--base=} ;;
    --profile=*) profile=${arg#--profile=} ;;
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
# side_command NAME: the command line of side NAME (in the array cmd).
side_command() {
  local name=$1 extra=()
  [[ $name == *-nocache ]] && extra+=(--fp8_weight_cache=false) && name=${name%-nocache}
  [[ $name == *-accum4 ]] && extra+=(--accumulate=4) && name=${name%-accum4}
  if [ ${#extra[@]} -gt 0 ] && [[ $name != ours-* ]]; then
    echo "gpt_compare.sh: side '$1': -accum4 and -nocache apply to ours-* sides only" >&2
    exit 2
  fi
  case "$name" in
    ours-eager) cmd=("$bin" "${common[@]}" --accelerator="$device") ;;
    ours-graphs) cmd=("$bin" "${common[@]}" --accelerator="$device" --cuda_graphs) ;;
    ours-aten-layernorm) cmd=("$bin" "${common[@]}" --accelerator="$device" --fused_layer_norm=false) ;;
    ours-fp8) cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed) ;;
    ours-fp8-rowwise)
      cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --fp8_recipe=rowwise) ;;
    ours-fp8-delayed)
      cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --fp8_recipe=delayed) ;;
    ours-fp8-delayed-tilegrid)
      cmd=(env FABRIC_FP8_CAST_GRID=tile "$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --fp8_recipe=delayed) ;;
    ours-fp8-graphs) cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --cuda_graphs) ;;
    ours-fp8-delayed-graphs)
      cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --fp8_recipe=delayed --cuda_graphs) ;;
    ours-fp8-precise)
      cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --fp8_fast_accumulation=false) ;;
    ours-fp8-auto)
      cmd=("$bin" "${common[@]}" --accelerator="$device" --precision=fp8-mixed --fp8_exclude=auto_filter_small_kn) ;;
    pytorch-eager) cmd=("$python" "$ref" "${common[@]}" --device="$device" --mode=eager) ;;
    pytorch-compile) cmd=("$python" "$ref" "${common[@]}" --device="$device" --mode=compile) ;;
    *) echo "gpt_compare.sh: unknown side '$1'" >&2; exit 2 ;;
  esac
  cmd+=("${extra[@]}")
}
IFS=',' read -r -a side_list <<<"$sides"
IFS=',' read -r -a profile_list <<<"$profile"
for name in "${side_list[@]}" "${profile_list[@]}"; do side_command "$name"; done  # names checked
for ((r = 1; r <= reps; r++)); do
  for name in "${side_list[@]}"; do
    side_command "$name"
    side "$name" "${cmd[@]}"
  done
done
# Where a side spends a step (8 profiled steps after the timed ones start).
first=1
for name in "${profile_list[@]}"; do
  summary="$out/trace_summary.txt"
  [ "$name" = pytorch-eager ] && summary="$out/trace_summary_pytorch.txt"
  [ "$name" != pytorch-eager ] && [ $first -eq 0 ] && summary="$out/trace_summary_$name.txt"
  [ "$name" != pytorch-eager ] && first=0
  side_command "$name"
  "${cmd[@]}" --profile="$out/trace.json" --profile_steps=8 >"$out/profile_$name.log" 2>&1 &&
    "$python" "$(dirname "$ref")/trace_summary.py" --top=25 "$out/trace.json" >"$summary" 2>&1
  rm -f "$out/trace.json"
done
"$python" - "$results" "$sides" "$base" >"$out/table.md" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
order, base_side = sys.argv[2].split(","), sys.argv[3]
by = {}
for r in rows:
    by.setdefault(r["side"], []).append(r)
med = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in by.items()}
base = med.get(base_side)
print(f"| side | runs | tokens/s (median) | MFU | step ms | peak MiB | vs {base_side} |")
print("|---|---|---|---|---|---|---|")
for k in order:
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
