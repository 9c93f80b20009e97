#!/usr/bin/env bash
# Issue 69 item 7 on one GPU: a Llama-3.2-1B-shaped random model (bf16-mixed, sequence 2048)
# trained by ours (examples/gpt model.pretrained=) and by transformers (tools/bench/
# llama_hf_train.py: SDPA, fused AdamW, the same batch, eager and torch.compile), and decoded by
# ours (examples/generate) and by transformers.generate. gpu_check.sh --suite=pretrained runs
# each STEP as one row of its report, in this order, with the same flags:
#
#   llama_gpu_bench.sh STEP BUNDLE OUT [--cpu] [--batch=auto] [--steps=20] [--warmup=5]
#                      [--new_tokens=128]
#   STEP  pylib        unpack BUNDLE/bench/transformers.tar.gz (transformers as tools/requirements.txt
#                      pins it, only its llama and auto models: gpu_check.sh build) into OUT/pylib
#                      and check `from transformers import LlamaForCausalLM`; if that fails, the
#                      node's own transformers; if neither, every later step skips
#         make         OUT/llama/model: the random Llama folder and a tokenizer.json
#                      (llama_hf_train.py make; on CUDA: built on the meta device, filled there)
#         tokens       OUT/tokens: BUNDLE's prepare_text --tokenizer= over OUT/llama/corpus.txt
#         ours-train   BUNDLE's gpt, bf16-mixed, AdamW (optimizer.implementation auto = fused),
#                      clipping 1.0, --warmup + --steps steps logged every --warmup steps: the
#                      rate of the windows after the first (metrics.csv)
#         ours-train-unfused  the same with model.fused_layer_norm=false
#                      model.fused_elementwise=false (ATen's RMSNorm, rotary and SwiGLU: what
#                      the fused kernels give)
#         ours-train-fp8  the same with fabric.precision=fp8-mixed (tensorwise: the recipe
#                      TorchTitan's float8 default matches); ours-train-fp8-delayed:
#                      fabric.fp8.recipe=delayed (issue 72 item 3: fp8 against TorchTitan's)
#         hf-train     transformers eager; hf-compile (run last by gpu_check): each decoder
#                      layer under torch.compile
#         ours-decode  BUNDLE's generate, greedy, --new_tokens ids, no eos stop, bf16-mixed;
#                      ours-decode-bf16: fabric.precision=bf16-true
#         hf-decode    transformers.generate on ours' prompt ids, float32 weights under autocast;
#                      hf-decode-bf16: bfloat16 weights
#         ours-lora    BUNDLE's lora_step (issue 70 item 6): one LoRA step, rank 16 on all seven
#                      projections, --steps=10 after 3, bf16-mixed, writing its initial adapter;
#                      peft-lora: lora_step_peft.py (transformers + peft, bench/peft.tar.gz or the
#                      node's) from that adapter: tokens/s and peak memory against peft's
#         torchtitan   tools/bench/torchtitan_step.py (issue 72 item 3): TorchTitan 0.2.2's llama3
#                      Transformer at the make row's shape (config.json; else the built-in 1B or
#                      tiny one), --batch x sequence, random ids, SDPA, FSDP2 on one rank (bf16
#                      params, float32 reduce), fused AdamW, clip 1.0, --warmup + --steps; wheels
#                      from bench/torchtitan.tar.gz into OUT/titanlib (pip --no-index), else the
#                      node's; torchtitan-compile (run last): its per-block torch.compile;
#                      torchtitan-fp8, torchtitan-fp8-compile: with TorchTitan's float8
#                      converter (torchao Float8Linear, tensorwise, "output" filtered; torchao
#                      carried in the same bench/torchtitan.tar.gz)
#         table        OUT/table.md from OUT/results.jsonl
# --cpu: the tiny shape (llama_hf_train.py --tiny), 32-true, sequence 64, batch 2, 2 + 1 steps,
# 16 new ids, no torch.compile: checks the logic end to end without a GPU. --batch=auto: 8 on a
# GPU of 120 GiB or more (H200), else 4.
# Exit status: 0 done; 77 skipped (the last line says why); other: failed.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: llama_gpu_bench.sh STEP BUNDLE OUT [flags]" >&2; exit 2; }
step=$1 bundle=$2 out=$3
shift 3
cpu=0 batch=auto steps=20 warmup=5 new_tokens=128
for arg in "$@"; do
  case "$arg" in
    --cpu) cpu=1 ;;
    --batch=*) batch=${arg#--batch=} ;;
    --steps=*) steps=${arg#--steps=} ;;
    --warmup=*) warmup=${arg#--warmup=} ;;
    --new_tokens=*) new_tokens=${arg#--new_tokens=} ;;
    *) echo "llama_gpu_bench.sh: unknown flag '$arg'" >&2; exit 2 ;;
  esac
done
python=${PYTHON:-python3}
hf="$bundle/bench/llama_hf_train.py"
mkdir -p "$out" || exit 1
results="$out/results.jsonl"
device=cuda precision=bf16-mixed block=2048 accel=(fabric.accelerator=cuda fabric.devices=1)
if [ $cpu -eq 1 ]; then
  device=cpu precision=32-true block=64 accel=(fabric.accelerator=cpu fabric.devices=1)
  [ "$batch" = auto ] && batch=2
  steps=2 warmup=1 new_tokens=16
fi
if [ "$batch" = auto ]; then
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1)
  batch=4
  [ -n "$mib" ] && [ "${mib%%.*}" -ge 120000 ] && batch=8
fi
prompt="Once upon a time, a small model was trained on one GPU"

skip() { echo "skipped: $*"; exit 77; }
need_transformers() {
  [ -f "$out/env" ] || skip "no transformers (see the pylib row)"
  # shellcheck disable=SC1091
  . "$out/env"
}
need_model() {
  [ -f "$out/llama/model/config.json" ] || skip "no model folder (see the make row)"
}
# record FILE: the last RESULT line of FILE into results.jsonl.
record() {
  local line
  line=$(grep '^RESULT ' "$1" | tail -n 1)
  [ -n "$line" ] || { echo "no RESULT line in $1"; return 1; }
  echo "${line#RESULT }" >>"$results"
  "$python" -c 'import json, sys
r = json.loads(sys.argv[1])
if "tokens_per_s" in r:
    mfu, tps, ms = r.get("mfu"), r["tokens_per_s"], r["step_ms"]
    mfu = "-" if mfu is None else f"{100 * mfu:.1f}%"
    print(f"rate: {tps:,.0f} tokens/s, MFU {mfu}, {ms:.1f} ms/step")
else:
    rate = r["decode_tokens_per_second"]
    print(f"rate: decode {rate:,.1f} tokens/s")' "${line#RESULT }"
}

case "$step" in
  pylib)
    rm -rf "$out/pylib" "$out/env"
    : >"$results"
    check='import tokenizers, safetensors, transformers
from transformers import LlamaForCausalLM
print("transformers", transformers.__version__, "at", transformers.__file__, "; tokenizers", tokenizers.__version__)'
    why=""
    # peft (the LoRA rows' reference) beside whichever transformers serves: the carried one
    # (bench/peft.tar.gz), else the node's; the rows say when neither imports.
    rm -rf "$out/peftlib"
    if [ -f "$bundle/bench/peft.tar.gz" ]; then
      mkdir -p "$out/peftlib" && tar -xzf "$bundle/bench/peft.tar.gz" -C "$out/peftlib"
    fi
    peft_path="export PYTHONPATH=\"\${PYTHONPATH:+\$PYTHONPATH:}$out/peftlib\""
    if [ -f "$bundle/bench/transformers.tar.gz" ]; then
      mkdir -p "$out/pylib" && tar -xzf "$bundle/bench/transformers.tar.gz" -C "$out/pylib" &&
        PYTHONPATH="$out/pylib${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "$check" &&
        { echo "export PYTHONPATH=\"$out/pylib\${PYTHONPATH:+:\$PYTHONPATH}\"" >"$out/env"
          echo "$peft_path" >>"$out/env"; exit 0; }
      why="the carried transformers did not import; "
    else
      why="no carried transformers (BUNDLE/bench/transformers.tar.gz); "
    fi
    rm -rf "$out/pylib"
    if "$python" -c "$check"; then
      { echo "# ${why}the node's own"; echo "$peft_path"; } >"$out/env"
      echo "using the node's own transformers (${why%; })"
      exit 0
    fi
    skip "${why}no transformers on the node either: the transformers rows and the model folder are skipped"
    ;;
  make)
    need_transformers
    rm -rf "$out/llama"
    flags=(--device="$device")
    [ $cpu -eq 1 ] && flags+=(--tiny --corpus_mb=1)
    "$python" "$hf" make "$out/llama" "${flags[@]}" --text="$bundle/bench/*.py" \
      --text="$bundle/bench/*.sh" --text="$bundle/configs/*.yaml" --text="$bundle/gpu_check.sh"
    ;;
  tokens)
    need_model
    rm -rf "$out/tokens"
    "$bundle/run.sh" prepare_text --input="$out/llama/corpus.txt" --output="$out/tokens" \
      --tokenizer="$out/llama/model/tokenizer.json"
    ;;
  ours-train|ours-train-unfused|ours-train-fp8|ours-train-fp8-delayed)
    need_model
    [ -f "$out/tokens/meta.json" ] || skip "no token files (see the tokens row)"
    dtype=$("$python" -c 'import json, sys; print("uint32" if json.load(open(sys.argv[1]))["vocab_size"] > 65536 else "uint16")' "$out/tokens/meta.json") || exit 1
    side=ours p=$precision extra=() peak_out="$out/peak_tflops"
    if [ "$step" = ours-train-unfused ]; then
      side=ours-unfused peak_out=/dev/null
      extra=(model.fused_layer_norm=false model.fused_elementwise=false)
    elif [ "$step" != ours-train ]; then
      # fp8-mixed: bf16-mixed with the projections' GEMMs in float8 (the tied output stays
      # bf16, as TorchTitan's filter keeps "output"); MFU against the same bf16 peak.
      side=ours-fp8 p=fp8-mixed peak_out=/dev/null
      [ "$step" = ours-train-fp8-delayed ] && side=ours-fp8-delayed extra=(fabric.fp8.recipe=delayed)
    fi
    run="$out/runs/$side"
    rm -rf "$run"
    "$bundle/run.sh" gpt model.pretrained="$out/llama/model" data.root="$out/tokens" \
      data.token_dtype="$dtype" model.block_size=$block data.batch_size="$batch" \
      trainer.max_steps=$((warmup + steps)) logging.log_every_n_steps="$warmup" trainer.max_epochs=1000 \
      optimizer.name=adamw optimizer.lr=3e-4 'optimizer.betas=[0.9,0.95]' optimizer.weight_decay=0.1 \
      trainer.gradient_clip_val=1.0 trainer.limit_eval_batches=1 gpt.eval_every_n_steps=0 \
      gpt.sample_tokens=0 checkpoint.every_n_epochs=0 checkpoint.save_last=false \
      checkpoint.export_weights=none "${accel[@]}" fabric.precision="$p" "${extra[@]}" \
      logging.run_dir="$run" || exit
    # The windows after the first (warm-up): tokens over their time (every window holds as many).
    "$python" - "$run" "$batch" "$block" "$steps" "$warmup" "$peak_out" "$side" >"$out/$step.result" <<'PY' || exit 1
import csv, json, sys
run, batch, block, steps, warmup, peak_file, side = sys.argv[1], *map(int, sys.argv[2:6]), *sys.argv[6:8]
s = json.load(open(f"{run}/summary.json"))
rows = [r for r in csv.DictReader(open(f"{run}/metrics.csv")) if r.get("train/tokens_per_second")]
timed = [r for r in rows if int(r["step"]) > warmup]
if not timed:
    sys.exit(f"{run}/metrics.csv: no window after step {warmup}")
tps = len(timed) / sum(1 / float(r["train/tokens_per_second"]) for r in timed)
mfu = None
if timed[0].get("train/mfu"):
    r = timed[0]
    mfu = tps * float(r["train/mfu"]) / float(r["train/tokens_per_second"])
    with open(peak_file, "w") as f:  # the peak ours used: TFLOP/s over MFU
        f.write(f"{float(r['train/tflops']) / float(r['train/mfu']):.3f}\n")
peak = s.get("peak_tensor_bytes")
print("RESULT " + json.dumps({
    "side": side, "device": s["device"], "precision": s["precision"], "batch": batch,
    "block_size": block, "steps": len(timed) * warmup, "warmup": warmup,
    "loss": s["train_loss"], "parameters": s["parameters"], "tokens_per_s": tps,
    "step_ms": 1000 * batch * block / tps, "flops_per_token": s["flops_per_token"],
    "tflops": tps * s["flops_per_token"] / 1e12, "mfu": mfu,
    "summary_tokens_per_s": s["tokens_per_s"],
    "peak_device_mib": peak / 2**20 if peak else None}))
PY
    record "$out/$step.result"
    ;;
  hf-train|hf-compile)
    need_transformers
    need_model
    [ -f "$out/tokens/meta.json" ] || skip "no token files (see the tokens row)"
    mode=eager
    if [ "$step" = hf-compile ]; then
      [ $cpu -eq 1 ] && skip "--cpu: torch.compile on a CPU says nothing about the GPU"
      mode=compile
    fi
    peak=0
    [ -s "$out/peak_tflops" ] && peak=$(cat "$out/peak_tflops")
    "$python" "$hf" train --model="$out/llama/model" --data="$out/tokens" --batch="$batch" \
      --block_size=$block --steps="$steps" --warmup="$warmup" --device=$device \
      --precision=$precision --mode=$mode --peak_tflops="$peak" 2>&1 | tee "$out/$step.result" || exit
    record "$out/$step.result"
    ;;
  ours-decode|ours-decode-bf16)
    need_model
    p=$precision side=ours
    [ "$step" = ours-decode-bf16 ] && p=bf16-true side=ours-bf16-true
    "$bundle/run.sh" generate model.pretrained="$out/llama/model" generate.prompt="$prompt" \
      generate.max_new_tokens="$new_tokens" generate.stop_at_eos=false \
      generate.output="$out/$step.json" "${accel[@]}" fabric.precision=$p || exit
    "$python" -c 'import json, sys
o = json.load(open(sys.argv[1]))
print("RESULT " + json.dumps({"side": sys.argv[2], "precision": sys.argv[3], "prompt_tokens": len(o["prompt_ids"]),
      "new_tokens": len(o["ids"]), "first_token_s": o["prefill_seconds"],
      "decode_tokens_per_second": o["decode_tokens_per_second"], "ids": o["ids"]}))' \
      "$out/$step.json" "$side-generate" "$p" >"$out/$step.result" || exit 1
    record "$out/$step.result"
    ;;
  hf-decode|hf-decode-bf16)
    need_transformers
    need_model
    [ -f "$out/ours-decode.json" ] || skip "no prompt ids (see the ours-decode row)"
    w=float32
    [ "$step" = hf-decode-bf16 ] && w=bfloat16
    "$python" "$hf" decode --model="$out/llama/model" --prompt_ids="$out/ours-decode.json" \
      --new_tokens="$new_tokens" --device=$device --weights=$w 2>&1 | tee "$out/$step.result" || exit
    record "$out/$step.result"
    ;;
  ours-lora|peft-lora)
    # Issue 70 item 6: one LoRA step on the same model, ours (lora_step) against transformers +
    # peft (lora_step_peft.py) from the same initial adapters: rank 16, alpha 32, all seven
    # projections, random windows of block_size + 1 ids, fused AdamW, bf16 autocast.
    need_model
    lflags=(--model="$out/llama/model" --seq=$block --batch="$batch" --warmup=3 --steps=10
            --rank=16 --alpha=32 --targets=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj
            --device=$device --precision=$precision)
    [ $cpu -eq 1 ] && lflags+=(--warmup=1 --steps=2)
    if [ "$step" = ours-lora ]; then
      [ -x "$bundle/bin/lora_step" ] || skip "no lora_step in this bundle (gpu_check.sh build --suite=pretrained)"
      rm -rf "$out/lora_adapter"
      "$bundle/run.sh" lora_step "${lflags[@]}" --save_adapter="$out/lora_adapter" >"$out/$step.raw" || exit
      side=ours-lora
    else
      need_transformers
      "$python" -c 'import peft' 2>/dev/null || skip "no peft: neither carried (bench/peft.tar.gz) nor on the node"
      [ -d "$out/lora_adapter" ] || skip "no initial adapter (see the ours-lora row)"
      "$python" "$bundle/bench/lora_step_peft.py" "${lflags[@]}" --load_adapter="$out/lora_adapter" \
        >"$out/$step.raw" || exit
      side=transformers-peft-lora
    fi
    "$python" - "$out/$step.raw" "$side" >"$out/$step.result" <<'PY' || exit 1
import json, sys
line = [l for l in open(sys.argv[1]) if l.startswith("RESULT ")][-1]
r = json.loads(line[len("RESULT "):])
print("RESULT " + json.dumps({
    "side": sys.argv[2], "lora": True, "device": r["device"], "precision": r["precision"],
    "batch": r["batch"], "block_size": r["seq"], "tokens_per_s": r["tokens_per_s"],
    "step_ms": r["step_ms_median"], "peak_device_mib": r["peak_mib"], "loss0": r["loss0"],
    "loss": r["loss"], "losses": r["losses"], "trainable_params": r["trainable_params"],
    "mfu": None}))
PY
    record "$out/$step.result"
    ;;
  torchtitan|torchtitan-compile|torchtitan-fp8|torchtitan-fp8-compile)
    # Issue 72 item 3: TorchTitan's own llama3 Transformer at ours' shape, batch and sequence
    # (tools/bench/torchtitan_step.py: SDPA, FSDP2 on one rank with its bf16 mixed precision,
    # fused AdamW, clipping 1.0, random ids), eager and per-block torch.compile. Its wheels come
    # from BUNDLE/bench/torchtitan.tar.gz (pure Python, installed into OUT/titanlib for this row
    # only), else the node's own torchtitan.
    mode=eager float8=none
    if [[ "$step" == *-compile ]]; then
      [ $cpu -eq 1 ] && skip "--cpu: torch.compile on a CPU says nothing about the GPU"
      mode=compile
    fi
    [[ "$step" == torchtitan-fp8* ]] && float8=tensorwise
    lib="$out/titanlib"
    if [ -f "$bundle/bench/torchtitan.tar.gz" ] && [ ! -f "$lib/.installed" ]; then
      rm -rf "$lib" "$out/titanwheels"
      mkdir -p "$lib" "$out/titanwheels" &&
        tar -xzf "$bundle/bench/torchtitan.tar.gz" -C "$out/titanwheels" || exit 1
      if ! "$python" -m pip install --quiet --no-index --no-deps --no-compile --target "$lib" \
           "$out/titanwheels"/*.whl; then
        echo "pip install failed; unpacking the (pure-Python) wheels instead"
        "$python" -c 'import sys, zipfile
for w in sys.argv[2:]:
    zipfile.ZipFile(w).extractall(sys.argv[1])' "$lib" "$out/titanwheels"/*.whl || exit 1
      fi
      touch "$lib/.installed"
    fi
    tpath="${PYTHONPATH:-}"
    [ -f "$lib/.installed" ] && tpath="$lib${PYTHONPATH:+:$PYTHONPATH}"
    if ! err=$(PYTHONPATH="$tpath" "$python" -c 'import torchtitan, torchdata, tyro' 2>&1); then
      [ -f "$lib/.installed" ] && skip "the carried torchtitan (bench/torchtitan.tar.gz) did not import: $(tail -n 1 <<<"$err")"
      skip "no torchtitan: neither carried (bench/torchtitan.tar.gz: gpu_check.sh build --suite=pretrained) nor on the node"
    fi
    if [ $float8 != none ] && ! err=$(PYTHONPATH="$tpath" "$python" -c 'from torchao.float8 import convert_to_float8_training' 2>&1); then
      skip "no torchao for TorchTitan's float8 (bench/torchtitan.tar.gz carries it): $(tail -n 1 <<<"$err")"
    fi
    tflags=(--shape=1b)
    [ $cpu -eq 1 ] && tflags=(--shape=tiny)
    [ -f "$out/llama/model/config.json" ] && tflags=(--config="$out/llama/model/config.json")
    peak=0
    [ -s "$out/peak_tflops" ] && peak=$(cat "$out/peak_tflops")
    PYTHONPATH="$tpath" "$python" "$bundle/bench/torchtitan_step.py" "${tflags[@]}" --batch="$batch" \
      --seq=$block --warmup="$warmup" --steps="$steps" --device=$device --precision=$precision \
      --mode=$mode --float8=$float8 --peak_tflops="$peak" 2>&1 | tee "$out/$step.result" || exit
    record "$out/$step.result"
    ;;
  table)
    [ -s "$results" ] || skip "no results"
    "$python" - "$results" >"$out/table.md" <<'PY' || exit 1
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
train = [r for r in rows if "tokens_per_s" in r and not r.get("lora")]
lora = [r for r in rows if r.get("lora")]
dec = [r for r in rows if "decode_tokens_per_second" in r]
def pct(x): return f"{100 * x:.1f}%" if x is not None else "-"
def mib(x): return f"{x:,.0f}" if x is not None else "-"
base = next((r for r in train if r["side"] == "transformers-eager"), None)
comp = next((r for r in train if r["side"] == "transformers-compile"), None)
if train:
    r0 = train[0]
    hv = next((r["transformers"] for r in rows if "transformers" in r), "-")
    print(f"Training (transformers {hv}): batch {r0['batch']} x {r0['block_size']} tokens, {r0['precision']}, "
          f"{r0['steps']} timed steps after {r0['warmup']}; FLOPs/token {r0['flops_per_token']:.4g}")
    fpt = {r["side"]: r["flops_per_token"] for r in train}
    if max(fpt.values()) > 1.0001 * min(fpt.values()):
        print(f"**FLOPs per token differ between the sides** ({fpt}): MFU is not comparable")
    print()
    print("| side | tokens/s | MFU | step ms | peak MiB | loss at the end | vs transformers eager "
          "| vs transformers compile |")
    print("|---|---|---|---|---|---|---|---|")
    for r in train:
        name = r["side"] if r["precision"] == r0["precision"] else f"{r['side']} ({r['precision']})"
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.3f}x" if base else "-"
        ratio_c = f"{r['tokens_per_s'] / comp['tokens_per_s']:.3f}x" if comp else "-"
        print(f"| {name} | {r['tokens_per_s']:,.0f} | {pct(r.get('mfu'))} | {r['step_ms']:.1f} | "
              f"{mib(r.get('peak_device_mib'))} | {r['loss']:.4f} | {ratio} | {ratio_c} |")
    titan = [r for r in train if r["side"].startswith("torchtitan")]
    if titan:
        t = titan[0]
        print()
        print(f"torchtitan rows: TorchTitan {t.get('torchtitan', '?')} llama3 Transformer ({t.get('attention')}, "
              f"FSDP on one rank: {t.get('fsdp')}, tied: {t.get('tied')}) on random token ids: "
              "its loss is not comparable with the others'")
        f8 = next((r["float8"] for r in titan if r.get("float8")), None)
        if f8:
            print(f"torchtitan-fp8 rows: its Float8LinearConverter, torchao {f8['torchao']}, {f8['recipe']}, "
                  f"{f8['layers']} Linear layers in float8" + (" (emulated: no float8 GEMMs here)" if f8["emulate"] else ""))
        side = {r["side"]: r for r in train}
        pairs = [("ours", "ours-unfused"), ("ours", "torchtitan-eager"),
                 ("ours", "torchtitan-compile"),
                 ("ours-fp8", "torchtitan-fp8-eager"), ("ours-fp8", "torchtitan-fp8-compile"),
                 ("ours-fp8-delayed", "torchtitan-fp8-eager"),
                 ("ours-fp8-delayed", "torchtitan-fp8-compile")]
        lines = [f"{a} / {b}: {side[a]['tokens_per_s'] / side[b]['tokens_per_s']:.3f}x tokens/s"
                 for a, b in pairs if a in side and b in side]
        if lines:
            print()
            print("Against TorchTitan (issue 72 item 3; goal: ours >= its compiled bf16, ours fp8 >= its "
                  "compiled float8): " + "; ".join(lines))
if lora:
    peft = next((r for r in lora if r["side"] == "transformers-peft-lora"), None)
    print()
    print(f"LoRA step (rank 16 on all projections, the same initial adapters): batch {lora[0]['batch']} x "
          f"{lora[0]['block_size']}, {lora[0]['precision']}, {len(lora[0]['losses'])} steps")
    print()
    print("| side | tokens/s | step ms | peak MiB | loss first / last | vs peft tokens/s | vs peft memory |")
    print("|---|---|---|---|---|---|---|")
    for r in lora:
        ratio = f"{r['tokens_per_s'] / peft['tokens_per_s']:.3f}x" if peft else "-"
        mem = (f"{r['peak_device_mib'] / peft['peak_device_mib']:.3f}x"
               if peft and r.get("peak_device_mib") and peft.get("peak_device_mib") else "-")
        print(f"| {r['side']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.1f} | {mib(r.get('peak_device_mib'))} | "
              f"{r['loss0']:.4f} / {r['loss']:.4f} | {ratio} | {mem} |")
if dec:
    ours = next((r for r in dec if r["side"] == "ours-generate"), None)
    hfd = next((r for r in dec if r["side"] == "transformers-generate-float32"), None)
    print()
    print(f"Decode: greedy, {dec[0]['new_tokens']} new ids after {dec[0]['prompt_tokens']} prompt ids, batch 1, "
          "(new ids - 1) / time after the first")
    print()
    print("| side | decode tokens/s | vs transformers float32 (bf16 autocast on CUDA) | first ids equal ours |")
    print("|---|---|---|---|")
    for r in dec:
        ratio = f"{r['decode_tokens_per_second'] / hfd['decode_tokens_per_second']:.3f}x" if hfd else "-"
        same = "-"
        if ours and r is not ours:
            n = 0
            for a, b in zip(r["ids"], ours["ids"]):
                if a != b:
                    break
                n += 1
            same = f"{n} of {len(ours['ids'])}"
        print(f"| {r['side']} | {r['decode_tokens_per_second']:,.1f} | {ratio} | {same} |")
PY
    cat "$out/table.md"
    ;;
  *) echo "llama_gpu_bench.sh: unknown step '$step'" >&2; exit 2 ;;
esac
