#!/usr/bin/env bash
# One command to verify the CUDA paths on a GPU node that has PyTorch in Python but no Bazel.
#
#   tools/gpu_check.sh build [--out=DIR] [--suite=pretrained|titan]
#                                             here, with Bazel: writes the bundle (default
#                                             .device/gpu_check; must stay <= 64 MiB);
#                                             --suite=pretrained (or titan): what those run
#                                             (gpt, generate, prepare_text, env, lora_step,
#                                             transformers, peft; no data/ or install/)
#   DIR/gpu_check.sh run [flags]              on the node: runs the checks, prints a markdown report
#                                             to stdout (progress on stderr)
#
# The bundle (//tools:bundle with its default targets) holds every test tagged `gpu` with the
# helpers they start, the examples, //tools:env, the throughput benchmark; gpu_check adds the
# benchmark's Python side (tools/bench/*.py), tools/compare_weights.py, small Fashion-MNIST data
# for the image classifier (data/npy, data/images, written here with numpy and Pillow) and this
# script. `run` runs one suite; every row prints its time.
#   --suite=check (default; about 6 minutes on one H100, so a 15-minute GPU window can run it twice)
#     1. env        DIR/run.sh env: LibTorch, CUDA, cuDNN, NCCL, devices, what Fabric would set up
#     2. tests      every GPU-tagged test binary (gtest); a test that skips is reported as skipped
#     3. examples   world size 1: cifar10 (synthetic data) with single_gpu / amp / bf16 / ddp_amp
#                   over NCCL / CUDA graphs / dp falling back; fsdp bf16-mixed, fsdp 16-mixed with
#                   bf16 wires, ZeRO-1 16-mixed over NCCL, the recipe config in bf16, an async
#                   checkpoint and resume=auto from it, data.batch_size: auto under a memory
#                   fraction, the profiler with CUDA activities, an fsdp empty init
#     4. ranks      2 ranks on the one GPU (fabric.ddp.ranks_per_gpu=2, Gloo): fsdp full_shard /
#                   shard_grad_op and ZeRO-1 bitwise ddp's (compare_weights.py), fsdp's async
#                   sharded checkpoint resumed bitwise, a rank SIGKILLed under fabric.max_restarts
#                   finishing bitwise like the uninterrupted run, the image classifier on npy and
#                   on an image folder (pinned memory, loader threads); the GradScaler's inf
#                   agreement and SyncBatchNorm are rows of tests (cuda_ranks_test)
#   --suite=throughput: tools/bench/gpu_compare.py: ours (eager and CUDA graphs) vs the raw PyTorch
#                   loop vs Lightning Fabric, ResNet-18 CIFAR, reduced repetitions
#   --suite=gpt: tools/bench/gpt_compare.sh: the GPT-2 124M step (batch 16 x 1024, bf16-mixed,
#                   fused AdamW), ours (eager and CUDA graphs) vs the identical model in PyTorch
#                   (eager and torch.compile), with a profile summary of ours; tables in the report
#   --suite=model_parallel: gpt_cuda_test, fused_ops_cuda_test and fused_models_cuda_test (the
#                   fused loss and LayerNorm kernels, the models with them),
#                   the tiny GPT under tp 2 with sequence parallelism and dropout (2 ranks, Gloo),
#                   issue 71's: pp 2 (1f1b, gpipe, interleaved) and cp 2 against ddp (2 ranks),
#                   the pipeline schedules' bubble and activation memory on the GPU
#                   (pipeline_bubble --device=cuda --pp=2, 2 ranks on cuda:0; its table in the
#                   report),
#                   issue 70's: fsdp cpu_offload bitwise fsdp without it, peak device bytes
#                   (about 1.5 minutes on an H200: mp_rows about 60 s, bubble 24 s, 2026-11-30)
#   --suite=fp8: issue 72 item 2 (about 5.5 minutes on an H200: fp8_speed 220 s, fp8_loss 115 s,
#                   2026-11-30; since then fp8_nodes_cuda_test and the accum4 sides, about 1
#                   minute more, estimated): fp8_cuda_test (the float8 kernels
#                   against ATen, delayed scaling, the fused bias gradient and GELU),
#                   fp8_nodes_cuda_test (the GPT MLP, shared-input and Llama MLP nodes),
#                   gpt_compare.sh's ours-eager (bf16-mixed) vs ours-fp8 vs ours-fp8-delayed
#                   (and, on gpt2-medium, ours-graphs against ours-fp8-delayed-graphs: both with
#                   CUDA graphs;
#                   on both models ours-fp8-delayed-tilegrid: the cast kernels' grid before
#                   2026-11-30, a block per tile, against the default's wave; on gpt2-medium
#                   with 4 micro-batches a step, ours-eager-accum4, ours-fp8-delayed-accum4 and
#                   ours-fp8-delayed-accum4-nocache: what the kept float8 weight casts give)
#                   on gpt2-medium (batch 16) and gpt2-xl (batch 8) x 1024 tokens, 15 timed steps
#                   after 6, --reps interleaved, with a profile summary of ours-fp8-delayed on
#                   each (rowwise, measured on 2026-11-28, and ours-fp8-precise and
#                   ours-fp8-auto, measured on 2026-11-30, are left out: by hand),
#                   and the loss over the first 200 steps (gpt2-medium's shape on the byte corpus,
#                   batch 16 x 1024): bf16-mixed, fp8 tensorwise and delayed, val loss every 50,
#                   and bf16-mixed from seed 43 (the spread chance alone gives)
#   --suite=pretrained: issue 69 item 7, tools/bench/llama_gpu_bench.sh, one row per step
#                   (about 5 minutes on an H200, unverified until a GPU session runs it;
#                   best from `build --suite=pretrained`'s bundle, which carries transformers):
#                   transformers (bench/transformers.tar.gz, else the node's) checked;
#                   a Llama-3.2-1B-shaped random folder written (bf16 safetensors, tied, llama3
#                   rope; a tokenizer.json trained on the bundle's text) and its tokens
#                   (prepare_text); training, batch 8 (4 under 120 GiB) x 2048, 20 timed steps
#                   after 5: ours (gpt model.pretrained=, bf16-mixed, fused AdamW) vs transformers
#                   (SDPA, float32 weights + bf16 autocast, AdamW(fused=True)) eager and with
#                   torch.compile per decoder layer; greedy decode of 128 ids: ours (bf16-mixed,
#                   bf16-true) vs transformers.generate (float32 + autocast, bfloat16); a LoRA step
#                   (lora_step vs transformers + peft, bench/peft.tar.gz); TorchTitan 0.2.2's
#                   llama3 at the same shape, batch and sequence (bench/torchtitan.tar.gz, FSDP
#                   on one rank, bf16, SDPA, random ids), eager and per-block torch.compile
#                   (last); tables of tokens/s, MFU (one peak) and the ratios
#   --suite=titan: issue 72 item 3 from the same bundle and steps (about 10 minutes on an H200,
#                   estimated, unrun): the model folder and tokens, then ours bf16-mixed (and
#                   without the fused RMSNorm, rotary and SwiGLU kernels: ours-train-unfused) and
#                   fp8-mixed (tensorwise, and delayed) against TorchTitan's llama3 bf16 and with
#                   its float8 converter (torchao Float8Linear, tensorwise), each eager and with
#                   its per-block torch.compile; the table adds ours / TorchTitan ratios. In two
#                   calls: --skip=titan_compile, then --skip=titan_eager with the same --work
#   --suite=all: check, throughput and gpt.
# Without a usable GPU (or with --cpu) it runs what a CPU can: env, the GPU tests (they must load
# and skip), one example on CPU, the ranks rows on CPU (2 processes, shared memory) and the
# throughput binary on CPU; tools/ci_checks.sh runs this on every CI run so the bundle keeps
# building, relocating and running.
#
# run flags: --cpu (CPU checks only; --suite=pretrained then runs a tiny Llama on the CPU),
#   --suite=check|throughput|gpt|model_parallel|fp8|pretrained|titan|all or several of them
#   comma-separated (their sections each once, in the order env, tests, examples, ranks,
#   throughput, gpt, mp_rows, bubble, fp8's kernel tests, its speed rows, fp8_loss, pretrained;
#   pretrained and titan not together), --parallel (the untimed sections, tests, examples, ranks, model_parallel's mp_rows,
#   fp8's kernel tests and fp8_loss, run side by side, each in a background lane with its own
#   corpus cache and twice each row's time limit, then the timed ones (throughput, gpt, bubble,
#   fp8's speed rows, pretrained/titan) one after another, alone; for a GPU node's 16 cores: on a
#   2-vCPU machine it is slower than one at a time), --budget=S (no row starts once S seconds have
#   passed since the run began, and no row runs past them: a row cut short fails, one not started
#   is skipped; the report and --pack are still written, so a call with a hard limit keeps them:
#   S about 60 below it), --steps=N (example steps,
#   default 20), --reps=N (throughput repetitions, default 1), --skip=SECTION[,SECTION] (env,
#   tests, examples, ranks, throughput; within --suite=model_parallel: mp_rows, everything but
#   bubble, the timed pipeline_bubble row; within --suite=fp8: fp8_speed, the kernel test and the
#   timed sides, fp8_loss, the 200-step loss: a short GPU window runs the timed parts alone and
#   the untimed ones side by side; within --suite=titan: titan_compile, the two torch.compile
#   rows, titan_eager, every row but those and the table), --work=DIR (scratch folder for run
#   directories; default a new temporary folder; the report is also written to DIR/report.md),
#   --pack=FILE (a .tar.gz of the report and every log, table, metrics.csv and summary.json under
#   it: one file to carry back, no weights, checkpoints or traces).
# Exit status: 0 every check passed (skips allowed); 1 some check failed; 2 usage error.
# A row whose command exits 77 is SKIPPED, its last line the reason.
set -uo pipefail

usage() {
  echo "usage: tools/gpu_check.sh build [--out=DIR] [--suite=pretrained|titan] | DIR/gpu_check.sh run [--cpu] [--suite=check|throughput|gpt|model_parallel|fp8|pretrained|titan|all[,...]] [--parallel] [--budget=S] [--steps=N] [--reps=N] [--skip=LIST] [--work=DIR] [--pack=FILE]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
mode=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

limit_mib=64

build() {
  local out="" only=""
  for arg in "$@"; do
    case "$arg" in
      --out=*) out=${arg#--out=} ;;
      --suite=pretrained | --suite=titan) only=pretrained ;;
      *) echo "gpu_check build: unknown argument '$arg'" >&2; usage ;;
    esac
  done
  local repo
  repo=$(cd "$here/.." && pwd)
  [ -f "$repo/WORKSPACE" ] || { echo "gpu_check build: run it from a checkout (tools/gpu_check.sh)" >&2; exit 2; }
  cd "$repo" || exit 1
  out=${out:-$repo/.device/gpu_check}
  case "$out" in /*) ;; *) out="$PWD/$out" ;; esac
  # The bundle's default targets are what a GPU node needs (tools/bundle.sh).
  local targets=()
  [ "$only" = pretrained ] && targets=(//examples:gpt //examples:generate //tools:prepare_text //tools:env
                                       //tools/bench:lora_step)
  bazel run --noshow_progress //tools:bundle -- --out="$out" "${targets[@]}" >&2 || exit 1
  mkdir -p "$out/bench"
  cp tools/bench/gpu_compare.py tools/bench/throughput.py tools/bench/models.py tools/bench/trace_summary.py \
    tools/bench/gpt_reference.py tools/bench/gpt_compare.sh tools/bench/llama_hf_train.py \
    tools/bench/llama_gpu_bench.sh tools/bench/lora_step_peft.py tools/bench/torchtitan_step.py "$out/bench/"
  cp tools/gpu_check.sh "$out/gpu_check.sh"
  cp tools/compare_weights.py "$out/compare_weights.py"
  chmod +x "$out/gpu_check.sh"
  if [ "$only" = pretrained ]; then
    # Nothing of that suite installs Fabric++ or reads the image data; run refuses other suites.
    rm -rf "$out/install" "$out/install.sh"
    echo "pretrained titan" >"$out/SUITES"
  fi
  # The image classifier's rows: 512 + 128 Fashion-MNIST images as npy arrays and as a folder of
  # PNGs (the node may lack Pillow and the dataset).
  [ "$only" = pretrained ] || ${PYTHON:-python3} - "$out/data" <<'PY' || { echo "gpu_check build: could not write data/ (numpy, Pillow, /usr/share/datasets/fashion-mnist: tools/setup.sh)" >&2; exit 1; }
import gzip, os, sys
import numpy as np
from PIL import Image
src, root = '/usr/share/datasets/fashion-mnist', sys.argv[1]
def idx(name, offset):
    return np.frombuffer(gzip.open(f'{src}/{name}.gz').read(), np.uint8, offset=offset)
x = idx('train-images-idx3-ubyte', 16).reshape(-1, 28, 28)
y = idx('train-labels-idx1-ubyte', 8)
splits = {'train': (x[:512], y[:512]), 'val': (x[512:640], y[512:640])}
for split, (xs, ys) in splits.items():
    os.makedirs(f'{root}/npy/{split}', exist_ok=True)
    np.save(f'{root}/npy/{split}/inputs.npy', xs); np.save(f'{root}/npy/{split}/targets.npy', ys)
    for i, (im, label) in enumerate(zip(xs, ys)):
        d = f'{root}/images/{split}/{label}'
        os.makedirs(d, exist_ok=True)
        Image.fromarray(im, 'L').save(f'{d}/{i:04d}.png')
PY
  # --suite=pretrained's references, in that suite's bundle only (the full one is near the 64 MiB
  # a call carries; its pretrained rows use the node's transformers): this machine's transformers
  # (tools/requirements.txt pins it) as bench/transformers.tar.gz, its models/ cut to llama and
  # auto, and encoder_decoder and bloom that peft imports (about 2 MiB instead of the wheel's 13;
  # the node's tokenizers, safetensors and huggingface_hub serve it), and peft (pure Python, the
  # node has none) as bench/peft.tar.gz for the LoRA rows.
  if [ "$only" = pretrained ]; then
    local package
    for package in transformers peft; do
      ${PYTHON:-python3} - "$package" "$out/bench/$package.tar.gz" <<'PY' ||
import importlib, importlib.metadata as md, os, sys, tarfile
name, target = sys.argv[1], sys.argv[2]
src = os.path.dirname(importlib.import_module(name).__file__)
info = os.path.join(os.path.dirname(src), f"{name}-{md.version(name)}.dist-info")
models = ("__init__.py", "auto", "llama", "encoder_decoder", "bloom")
def keep(ti):
    parts = ti.name.split("/")
    if "__pycache__" in parts or ti.name.endswith(".pyc"):
        return None
    if parts[:2] == ["transformers", "models"] and len(parts) > 2 and parts[2] not in models:
        return None
    if parts[0].endswith(".dist-info") and len(parts) > 1 and parts[1] in ("RECORD", "INSTALLER"):
        return None
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    ti.mtime = 0
    return ti
with tarfile.open(target, "w:gz", compresslevel=9) as t:
    t.add(src, name, filter=keep)
    if os.path.isdir(info):
        t.add(info, os.path.basename(info), filter=keep)
PY
        { echo "gpu_check build: no $package here to carry (tools/setup.sh); --suite=pretrained will use the node's" >&2
          rm -f "$out/bench/$package.tar.gz"; }
    done
    # The torchtitan rows (issue 72 item 3): TorchTitan 0.2.2 (0.3.0 needs a nightly torch), the
    # pure-Python wheels its llama3 model imports, and torchao 0.17.0 (the first whose wheels
    # name torch 2.11 as their minimum; its float8 training is Python over _scaled_mm) for the
    # torchtitan-fp8 rows, as bench/torchtitan.tar.gz (about 4 MiB; the rows pip install them
    # --no-index into a folder of their own). Downloaded once (pip, PyPI) into
    # .device/torchtitan_wheels; without them the rows use the node's torchtitan.
    local wheels="$repo/.device/torchtitan_wheels" pins=(torchtitan==0.2.2 torchdata==0.11.0
      tyro==1.0.17 docstring_parser==0.18.0 typeguard==4.6.1 typing_extensions==4.16.0
      torchao==0.17.0)
    local pin wheel files=() missing=0
    for pin in "${pins[@]}"; do
      [ -n "$(ls "$wheels/${pin/==/-}-"*.whl 2>/dev/null)" ] || missing=1
    done
    if [ $missing -eq 1 ]; then
      mkdir -p "$wheels" && ${PYTHON:-python3} -m pip download --quiet --no-deps --only-binary=:all: \
        --dest "$wheels" "${pins[@]}" >&2 ||
        echo "gpu_check build: could not download ${pins[*]} (pip); the torchtitan rows will use the node's" >&2
    fi
    rm -f "$out/bench/torchtitan.tar.gz"
    for pin in "${pins[@]}"; do
      wheel=$(cd "$wheels" 2>/dev/null && ls "${pin/==/-}-"*.whl 2>/dev/null | head -n 1)
      [ -n "$wheel" ] && files+=("$wheel")
    done
    if [ ${#files[@]} -eq ${#pins[@]} ]; then
      tar -czf "$out/bench/torchtitan.tar.gz" -C "$wheels" "${files[@]}" || exit 1
    fi
  fi
  local kib
  kib=$(du -sk "$out" | cut -f1)
  if [ "$kib" -gt $((limit_mib * 1024)) ]; then
    echo "gpu_check build: $out is $((kib / 1024)) MiB, over the ${limit_mib} MiB a device run may carry" >&2
    exit 1
  fi
  echo "gpu_check build: wrote $out ($((kib / 1024)) MiB); on the node: $out/gpu_check.sh run" >&2
  echo "$out"
}

# --- run ---------------------------------------------------------------------------------------
rows=()       # markdown table rows
notes=()      # text after the table
passed=0 failed=0 skipped=0

# check NAME LIMIT_S COMMAND...: runs it with output in $work/logs/NAME.log; records a row;
# returns non-zero when the row failed.
# A gtest binary that skipped tests (and ran none) counts as skipped.
check() {
  local name=$1 limit=$2
  shift 2
  local log="$work/logs/${name//\//_}.log" t0 t1 rc status note  # a / in a name: _
  limit=$((limit * ${lane_scale:-1}))  # in a --parallel lane, twice the time
  if [ -n "$budget" ]; then
    # --budget: no row starts once it is spent, and none runs past it.
    local left=$((budget - $(date +%s) + run_start))
    if [ $left -le 5 ]; then
      ((skipped++))
      rows+=("| $name | SKIPPED | - | not started: --budget=${budget}s spent |")
      echo "gpu_check: $name SKIPPED (--budget spent)" >&2
      return 0
    fi
    [ "$limit" -le "$left" ] || limit=$left
  fi
  echo "gpu_check: $name ..." >&2
  t0=$(date +%s.%N)
  (cd "$work" && timeout --kill-after=10 "$limit" "$@") >"$log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  note=$(grep -E '^\[  (PASSED|SKIPPED|FAILED)  \]' "$log" | sed -E 's/\[ +([A-Z]+) +\] ([0-9]+) tests?.*/\1 \2/' | tr '\n' ' ')
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status=FAILED
    note="timed out after ${limit}s; $(tail -n 1 "$log" | cut -c1-160)"
  elif [ $rc -eq 77 ]; then
    status=SKIPPED
    note=$(tail -n 1 "$log" | cut -c1-400)
  elif [ $rc -ne 0 ]; then
    status=FAILED
    note=$(grep -m1 -E 'Failure|FAILED|[Ee]rror' "$log" | cut -c1-200)
    [ -n "$note" ] || note=$(tail -n 1 "$log" | cut -c1-200)
    note="exit $rc: $note"
  elif grep -qE '^\[  SKIPPED \]' "$log" && ! grep -qE '^\[       OK \]' "$log"; then
    status=SKIPPED
    note="$(grep -m1 -A1 'Skipped' "$log" | tail -n 1 | cut -c1-160)"
  else
    status=PASSED
    [ -n "$note" ] || note=$(grep -E "${CHECK_SUMMARY:-^$}" "$log" | sed -E 's/^ +//; s/  +/ /g' |
      sed -E 's/^RESULT .*"images_per_s": ([0-9.]+).*/\1 img\/s/' | paste -sd';' | cut -c1-200)
  fi
  case $status in PASSED) ((passed++)) ;; FAILED) ((failed++)) ;; SKIPPED) ((skipped++)) ;; esac
  rows+=("| $name | $status | $secs | ${note//|/\\|} |")
  echo "gpu_check: $name $status (${secs}s)" >&2
  [ "$status" != FAILED ]  # the status, for `check A && check B`
}


# section_on SECTION: whether run's --suite and --skip leave SECTION (a sec_* below) to run.
section_on() {
  case $1 in
    mp_rows | bubble) ! skipping model_parallel && ! skipping "$1" ;;
    fp8_tests) ! skipping fp8 && ! skipping fp8_speed ;;
    fp8_speed | fp8_loss) ! skipping fp8 && ! skipping "$1" ;;
    *) ! skipping "$1" ;;
  esac
}

# untimed SECTION: whether SECTION's rows measure nothing by their time (a --parallel lane may
# run them beside others).
untimed() {
  case $1 in tests | examples | ranks | mp_rows | fp8_tests | fp8_loss) return 0 ;; esac
  return 1
}

# lane SECTION: sec_SECTION in a background shell of its own (rows, notes and counts to
# $work/lanes/SECTION.*, its own corpus cache, twice the time limits); merge_lane SECTION adds
# them to run's, in the order run asks (a lane that left no counts is a failed row).
lane() {
  mkdir -p "$work/lanes"
  (
    rows=() notes=() passed=0 failed=0 skipped=0
    corpus="$work/corpus_$1" lane_scale=2
    "sec_$1"
    printf '%s\n' "${rows[@]}" >"$work/lanes/$1.rows"
    [ ${#notes[@]} -eq 0 ] || printf '%s\n' "${notes[@]}" >"$work/lanes/$1.notes"
    echo "$passed $failed $skipped" >"$work/lanes/$1.counts"
  ) &
}
merge_lane() {
  local f="$work/lanes/$1" p=0 x=0 s=0 line
  if ! read -r p x s 2>/dev/null <"$f.counts"; then
    ((failed++))
    rows+=("| lane $1 | FAILED | - | the lane ended without writing its results |")
    return
  fi
  passed=$((passed + p)) failed=$((failed + x)) skipped=$((skipped + s))
  [ -f "$f.rows" ] && while IFS= read -r line; do [ -n "$line" ] && rows+=("$line"); done <"$f.rows"
  [ -f "$f.notes" ] && while IFS= read -r line; do notes+=("$line"); done <"$f.notes"
  return 0
}

run() {
  local cpu=0 steps=20 reps=1 skip="" suite=check parallel=0
  work="" pack="" budget="" run_start=$(date +%s)
  for arg in "$@"; do
    case "$arg" in
      --cpu) cpu=1 ;;
      --parallel) parallel=1 ;;
      --budget=*) budget=${arg#--budget=} ;;
      --steps=*) steps=${arg#--steps=} ;;
      --reps=*) reps=${arg#--reps=} ;;
      --skip=*) skip=${arg#--skip=} ;;
      --suite=*) suite=${arg#--suite=} ;;
      --work=*) work=${arg#--work=} ;;
      --pack=*) pack=${arg#--pack=}; case "$pack" in /*) ;; *) pack="$PWD/$pack" ;; esac ;;
      *) echo "gpu_check run: unknown argument '$arg'" >&2; usage ;;
    esac
  done
  [[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check run: --steps must be a positive integer" >&2; exit 2; }
  [[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check run: --reps must be a positive integer" >&2; exit 2; }
  [ -z "$budget" ] || [[ "$budget" =~ ^[1-9][0-9]*$ ]] ||
    { echo "gpu_check run: --budget must be a positive number of seconds, not '$budget'" >&2; exit 2; }
  # --suite=A[,B...]: the sections of every suite named (pretrained and titan run the same steps).
  local on="" s suites=() titan=0 pretrained=0
  IFS=, read -ra suites <<<"$suite"
  [ ${#suites[@]} -gt 0 ] || { echo "gpu_check run: --suite is empty" >&2; exit 2; }
  for s in "${suites[@]}"; do
    case "$s" in
      check) on+=",env,tests,examples,ranks" ;;
      throughput | gpt | model_parallel | fp8) on+=",$s" ;;
      pretrained) on+=",pretrained"; pretrained=1 ;;
      titan) on+=",pretrained"; titan=1 ;;
      all) on+=",env,tests,examples,ranks,throughput,gpt" ;;
      *) echo "gpu_check run: --suite takes check, throughput, gpt, model_parallel, fp8, pretrained, titan or all (or several, comma-separated), not '$s'" >&2; exit 2 ;;
    esac
    if [ -f "$here/SUITES" ] && [[ " $(cat "$here/SUITES") " != *" $s "* ]]; then
      echo "gpu_check run: this bundle holds only what --suite=$(cat "$here/SUITES") needs (gpu_check.sh build --suite=...); build a full one for --suite=$s" >&2
      exit 2
    fi
  done
  [ $titan -eq 1 ] && [ $pretrained -eq 1 ] &&
    { echo "gpu_check run: --suite: pretrained and titan share their steps and folder; run them one at a time" >&2; exit 2; }
  for s in env tests examples ranks throughput gpt model_parallel fp8 pretrained; do
    [[ "$on," == *",$s,"* ]] || skip="$skip,$s"
  done
  [ -x "$here/run.sh" ] && [ -f "$here/MANIFEST" ] ||
    { echo "gpu_check run: $here is not a bundle (no run.sh/MANIFEST); build one with 'tools/gpu_check.sh build'" >&2; exit 2; }
  [ -n "$work" ] || work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
  mkdir -p "$work/logs" "$work/tests/integration" || exit 1
  # Tests start their helpers from the helper's package folder under the working directory
  # (Bazel's runfiles layout; fabric::testing::helper_binary in tests/run_command.h).
  for helper in ddp_parity_helper cuda_ranks_helper; do
    [ -x "$here/bin/$helper" ] && printf '#!/bin/sh\nexec "%s/run.sh" %s "$@"\n' "$here" "$helper" >"$work/tests/integration/$helper" &&
      chmod +x "$work/tests/integration/$helper"
  done
  printf '#!/bin/sh\nexec "%s/run.sh" throughput "$@"\n' "$here" >"$work/throughput" && chmod +x "$work/throughput"
  local python=${PYTHON:-python3}
  local runsh="$here/run.sh"
  skipping() { [[ ",$skip," == *",$1,"* ]]; }

  local gpu="none" driver="" torch
  torch=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo "not found")
  if [ $cpu -eq 0 ] && command -v nvidia-smi >/dev/null &&
     "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    gpu=$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
    driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
  else
    cpu=1
  fi

  skipping env || CHECK_SUMMARY='^  (loaded|CUDA available|device count|devices) ' check env 60 "$runsh" env

  # The sections in order (sec_* below). With --parallel the untimed ones (whose rows' seconds
  # measure nothing) run side by side, each in a lane of its own (a background shell with its own
  # corpus cache and twice each row's time limit), then the timed ones one after another, alone.
  local corpus="$work/corpus" lane_scale=1 sec lanes=()
  local order=(tests examples ranks throughput gpt mp_rows bubble fp8_tests fp8_speed fp8_loss pretrained)
  if [ $parallel -eq 1 ]; then
    for sec in "${order[@]}"; do section_on "$sec" && untimed "$sec" && lanes+=("$sec"); done
    for sec in "${lanes[@]}"; do lane "$sec"; done
    wait
    for sec in "${lanes[@]}"; do merge_lane "$sec"; done
  fi
  for sec in "${order[@]}"; do
    section_on "$sec" || continue
    [ $parallel -eq 1 ] && untimed "$sec" && continue
    "sec_$sec"
  done


  report >"$work/report.md"
  cat "$work/report.md"
  if [ -n "$pack" ]; then
    # One archive of what a reader needs (a lent node may hand back few files): no weights,
    # checkpoints, token files or traces.
    (cd "$work" && find . -type f \( -name '*.md' -o -name '*.log' -o -name '*.txt' -o -name '*.csv' \
       -o -name '*.jsonl' -o -name summary.json \) -size -4M -print0 | tar czf "$pack" --null -T -) ||
      echo "gpu_check run: could not write --pack=$pack" >&2
  fi
  [ $failed -eq 0 ]
}

# sec_tests: every GPU-tagged test binary.
sec_tests() {
  local t
  for t in $(sed -n 's/^binaries=//p' "$here/MANIFEST"); do
    [[ "$t" == *_test ]] || continue
    check "$t" 240 "$runsh" "$t" --gtest_brief=1
  done
}

# sec_examples: world size 1: the examples on CUDA (one cifar10 run on CPU).
sec_examples() {
  local common=(trainer.max_epochs=1 "trainer.max_steps=$steps" trainer.limit_eval_batches=2
                data.synthetic=true data.synthetic_train_size=6400 data.synthetic_test_size=512
                logging.log_every_n_steps=10 "logging.run_dir=$work/runs/{name}/{timestamp}"
                checkpoint.every_n_epochs=0)
  if [ $cpu -eq 1 ]; then
    CHECK_SUMMARY='accuracy' check "cifar10 single_cpu" 300 "$runsh" cifar10 --config=single_cpu.yaml \
      "${common[@]}" data.batch_size=32
  else
    local c
    for c in single_gpu amp bf16; do
      CHECK_SUMMARY='accuracy' check "cifar10 $c" 120 "$runsh" cifar10 --config=$c.yaml "${common[@]}"
    done
    CHECK_SUMMARY='accuracy' check "cifar10 ddp_amp (NCCL, 1 GPU)" 120 "$runsh" cifar10 --config=ddp_amp.yaml \
      "${common[@]}" fabric.devices=1
    CHECK_SUMMARY='accuracy' check "cifar10 single_gpu cuda_graphs" 120 "$runsh" cifar10 --config=single_gpu.yaml \
      "${common[@]}" fabric.cuda_graphs=true data.drop_last=true
    CHECK_SUMMARY='accuracy' check "cifar10 ddp_amp cuda_graphs (NCCL, 1 GPU)" 120 "$runsh" cifar10 \
      --config=ddp_amp.yaml "${common[@]}" fabric.devices=1 fabric.cuda_graphs=true data.drop_last=true
    # dp.yaml with one visible GPU runs single_device with a warning (README, Examples).
    CHECK_SUMMARY='accuracy|single_device' check "cifar10 dp (1 GPU: falls back)" 120 env CUDA_VISIBLE_DEVICES=0 \
      "$runsh" cifar10 --config=dp.yaml "${common[@]}"
    # World size 1 over NCCL: the sharded strategies' CUDA paths and the training features.
    CHECK_SUMMARY='accuracy' check "cifar10 fsdp bf16-mixed (NCCL, 1 GPU)" 120 "$runsh" cifar10 \
      --config=fsdp.yaml "${common[@]}" fabric.devices=1 fabric.precision=bf16-mixed
    CHECK_SUMMARY='accuracy' check "cifar10 fsdp 16-mixed, bf16 wires (NCCL, 1 GPU)" 120 "$runsh" cifar10 \
      --config=fsdp.yaml "${common[@]}" fabric.devices=1 fabric.precision=16-mixed \
      fabric.fsdp.param_dtype=bf16 fabric.fsdp.reduce_dtype=bf16
    CHECK_SUMMARY='accuracy' check "cifar10 ZeRO-1 16-mixed (NCCL, 1 GPU)" 120 "$runsh" cifar10 \
      --config=ddp_amp.yaml "${common[@]}" fabric.devices=1 fabric.ddp.shard_optimizer_state=true
    CHECK_SUMMARY='accuracy' check "cifar10_recipe bf16 (EMA, accumulation, activation ckpt)" 120 \
      "$runsh" cifar10 --config=cifar10_recipe.yaml "${common[@]}" fabric.accelerator=cuda \
      fabric.precision=bf16-mixed
    CHECK_SUMMARY='accuracy|resumed' check "cifar10 async checkpoint, resume=auto" 180 \
      "$here/gpu_check.sh" _resume_auto "$runsh" "$work/runs/async" "${common[@]}"
    # Issue 51 on CUDA: data.batch_size: auto halving on the caching allocator's out-of-memory
    # error (a 2 GiB memory fraction, so that the search meets it), the profiler's CUDA
    # kernels in the trace and the table, and an fsdp empty init over NCCL.
    CHECK_SUMMARY='auto:|accuracy' check "cifar10 data.batch_size: auto (CUDA OOM path)" 180 \
      "$runsh" cifar10 --config=single_gpu.yaml "${common[@]}" data.batch_size=auto \
      fabric.tensor_memory_limit_gb=2
    CHECK_SUMMARY='profiler|Self CUDA|accuracy' check "cifar10 profiler, CUDA activities" 120 \
      "$runsh" cifar10 --config=single_gpu.yaml "${common[@]}" profiler.enabled=true
    CHECK_SUMMARY='accuracy' check "cifar10 fsdp empty init (NCCL, 1 GPU)" 120 "$runsh" cifar10 \
      --config=fsdp.yaml "${common[@]}" fabric.devices=1 fabric.empty_init=true
    # The GPT recipe (configs/gpt2.yaml: GPT-2 124M's shape, bf16-mixed, fused AdamW, clipping)
    # on the default byte corpus, shortened: ddp, fsdp with Block units, CUDA graphs.
    local gpt=(--config=gpt2.yaml trainer.max_steps=12 trainer.accumulate_grad_batches=2
               gpt.eval_every_n_steps=6 trainer.limit_eval_batches=4 gpt.sample_tokens=32
               logging.log_every_n_steps=4 "logging.run_dir=$work/runs/{name}/{timestamp}"
               "gpt.corpus_cache=$corpus")
    CHECK_SUMMARY='val loss' check "gpt gpt2.yaml ddp bf16 (NCCL, 1 GPU)" 240 \
      "$runsh" gpt "${gpt[@]}" fabric.devices=1
    CHECK_SUMMARY='val loss' check "gpt gpt2.yaml fsdp Block units (NCCL, 1 GPU)" 240 \
      "$runsh" gpt "${gpt[@]}" fabric.devices=1 fabric.strategy=fsdp fabric.fsdp.wrap_modules=Block
    CHECK_SUMMARY='val loss' check "gpt gpt2.yaml fsdp, ATen LayerNorm (NCCL, 1 GPU)" 240 \
      "$runsh" gpt "${gpt[@]}" fabric.devices=1 fabric.strategy=fsdp fabric.fsdp.wrap_modules=Block \
      model.fused_layer_norm=false
    # (CUDA graphs capture one micro-batch per step: accumulation 1.)
    CHECK_SUMMARY='val loss' check "gpt gpt2.yaml cuda_graphs, activation ckpt" 240 \
      "$runsh" gpt "${gpt[@]}" fabric.devices=1 fabric.cuda_graphs=true \
      trainer.accumulate_grad_batches=1 "model.activation_checkpointing=[Block]"
    # Issue 50: fp8-mixed (float8 GEMMs through _scaled_mm, sm_89+) against the bf16 row above
    # (tok/s in both summaries), and model_parallel tp 2 on the one GPU (2 ranks, Gloo for CUDA
    # tensors): the tiny GPT, whose loss must fall.
    CHECK_SUMMARY='val loss|tok/s' check "gpt gpt2.yaml fp8-mixed (NCCL, 1 GPU)" 240 \
      "$runsh" gpt "${gpt[@]}" fabric.devices=1 fabric.precision=fp8-mixed
    CHECK_SUMMARY='val loss|tok/s' check "gpt gpt2.yaml fp8-mixed rowwise (NCCL, 1 GPU)" 240 \
      "$runsh" gpt "${gpt[@]}" fabric.devices=1 fabric.precision=fp8-mixed fabric.fp8.recipe=rowwise
    CHECK_SUMMARY='val loss|tok/s' check "gpt tiny model_parallel tp 2 (2 ranks, 1 GPU, Gloo)" 240 \
      "$runsh" gpt --config=gpt_tp.yaml fabric.accelerator=cuda fabric.devices=1 \
      fabric.ddp.ranks_per_gpu=2 fabric.model_parallel.tensor_parallel_size=2 \
      trainer.max_steps=40 gpt.sample_tokens=0 "logging.run_dir=$work/runs/{name}/{timestamp}" \
      "gpt.corpus_cache=$corpus"
  fi
}

# sec_ranks: 2 ranks: parity, resume, restart, the image classifier.
sec_ranks() {
  # Two ranks on the one GPU (Gloo), or on CPU (shared memory) without one; 16 steps of a narrow
  # ResNet-18, deterministic, so that resumes and restarts can be bitwise.
  local place=(fabric.devices=1 fabric.ddp.ranks_per_gpu=2)
  [ $cpu -eq 1 ] && place=(fabric.accelerator=cpu fabric.devices=2)
  local r2=("${place[@]}" model.width=16 data.synthetic=true data.synthetic_train_size=2048
            data.synthetic_test_size=256 data.batch_size=32 trainer.max_epochs=1 trainer.max_steps=16
            trainer.limit_eval_batches=2 logging.log_every_n_steps=8 checkpoint.every_n_steps=4
            checkpoint.every_n_epochs=0 fabric.precision=32-true fabric.sync_batchnorm=false
            fabric.deterministic=true)
  local rd="$work/ranks" cmp=("$python" "$here/compare_weights.py")
  # Parity: fsdp and ZeRO-1 are bitwise ddp's (docs/training.md, "Bitwise parity"), on a GPU too.
  CHECK_SUMMARY='accuracy' check "2 ranks ddp, 5 steps (reference)" 120 "$runsh" cifar10 --config=ddp.yaml \
    "${r2[@]}" trainer.max_steps=5 logging.run_dir="$rd/ddp5"
  local v
  for v in "fsdp full_shard|fsdp.yaml|fabric.fsdp.min_unit_params=1000" \
           "fsdp shard_grad_op|fsdp.yaml|fabric.fsdp.min_unit_params=1000 fabric.fsdp.sharding_strategy=shard_grad_op" \
           "ZeRO-1|ddp.yaml|fabric.ddp.shard_optimizer_state=true"; do
    IFS='|' read -r name config extra <<<"$v"
    # shellcheck disable=SC2086  # extra: several KEY=VALUE words
    CHECK_SUMMARY='^(bitwise|max_rel)' check "2 ranks $name vs ddp, 5 steps" 120 "$here/gpu_check.sh" _then \
      "$runsh" cifar10 --config="$config" "${r2[@]}" $extra trainer.max_steps=5 logging.run_dir="$rd/${name// /_}" \
      -- "${cmp[@]}" --bitwise "$rd/${name// /_}/weights.pt" "$rd/ddp5/weights.pt"
  done
  # 16 steps, a checkpoint every 4: resumes and restarts must be bitwise.
  CHECK_SUMMARY='accuracy' check "2 ranks ddp, 16 steps (reference)" 120 "$runsh" cifar10 --config=ddp.yaml \
    "${r2[@]}" logging.run_dir="$rd/ddp"
  CHECK_SUMMARY='^(bitwise|max_rel)' check "2 ranks fsdp, async sharded checkpoints vs ddp, 16 steps" 120 \
    "$here/gpu_check.sh" _then "$runsh" cifar10 --config=fsdp.yaml "${r2[@]}" fabric.fsdp.min_unit_params=1000 \
    checkpoint.async=true logging.run_dir="$rd/fsdp" -- "${cmp[@]}" --bitwise "$rd/fsdp/weights.pt" "$rd/ddp/weights.pt"
  CHECK_SUMMARY='^(bitwise|max_rel)' check "2 ranks fsdp resumed from step 8 (bitwise)" 120 \
    "$here/gpu_check.sh" _then "$runsh" cifar10 --config=fsdp.yaml "${r2[@]}" fabric.fsdp.min_unit_params=1000 \
    checkpoint.resume="$rd/fsdp/checkpoints/step-00000008.ckpt" logging.run_dir="$rd/fsdp_resumed" \
    -- "${cmp[@]}" --bitwise "$rd/fsdp_resumed/weights.pt" "$rd/fsdp/weights.pt"
  CHECK_SUMMARY='^(bitwise|max_rel)|restart 1' check "2 ranks, rank 1 SIGKILLed, max_restarts (bitwise)" 180 \
    "$here/gpu_check.sh" _restart "$runsh" "$rd/restart" "$rd/ddp/weights.pt" --config=ddp.yaml "${r2[@]}"
  local ic=("${place[@]}" --config=single_cpu.yaml fabric.accelerator=auto fabric.strategy=ddp model.width=8
            data.batch_size=32 data.image_size=32 data.num_workers=2 trainer.max_epochs=1
            trainer.max_steps=8 trainer.limit_eval_batches=2 logging.log_every_n_steps=4
            checkpoint.every_n_epochs=0 "logging.run_dir=$work/runs/{name}/{timestamp}")
  [ $cpu -eq 1 ] && ic+=(fabric.accelerator=cpu)
  CHECK_SUMMARY='accuracy|images \[' check "2 ranks image_classifier npy" 120 "$runsh" image_classifier \
    "${ic[@]}" data.root="$here/data/npy"
  CHECK_SUMMARY='accuracy|images \[' check "2 ranks image_classifier image folder (PNG)" 120 "$runsh" \
    image_classifier "${ic[@]}" data.root="$here/data/images"
}

# sec_throughput: ResNet-18 CIFAR against raw PyTorch and Lightning (timed).
sec_throughput() {
  local table="$work/logs/throughput.md"
  if [ $cpu -eq 1 ]; then
    CHECK_SUMMARY='^RESULT' check "throughput (CPU, ours only)" 120 "$work/throughput" --accelerator=cpu \
      --batch=16 --steps=3 --warmup=1 --precision=32-true
  else
    CHECK_SUMMARY='^\| resnet18' check "throughput" 300 "$python" "$here/bench/gpu_compare.py" \
      --cpp="$work/throughput" --reps="$reps" --steps=40 --warmup=10 --batches=512 \
      --precisions=32-true,bf16-mixed --frameworks=fabric++,fabric++graphs,raw,lightning --timeout=120
    sed -n '/^| model/,$p' "$work/logs/throughput.log" >"$table"
    if [ -s "$table" ]; then
      notes+=("" "### Throughput (ResNet-18 CIFAR, batch 512, 40 timed steps after 10, $reps repetition(s), median img/s)" "")
      while IFS= read -r line; do notes+=("$line"); done <"$table"
      grep -q 'failed' "$table" && { ((failed++)); rows+=("| throughput table | FAILED | - | a framework failed (see the table) |"); }
    fi
  fi
}

# sec_gpt: the GPT-2 124M step against PyTorch (timed).
sec_gpt() {
  local gdir="$work/gpt" gflags=(--reps="$reps")
  [ $cpu -eq 1 ] && gflags+=(--device=cpu --model=gpt-tiny --batch=4 --steps=3 --warmup=1 --precision=32-true)
  CHECK_SUMMARY='^\| (ours|pytorch)' check "gpt" 580 "$here/bench/gpt_compare.sh" "$work/throughput" \
    "$here/bench/gpt_reference.py" "$gdir" "${gflags[@]}"
  if [ -s "$gdir/table.md" ]; then
    notes+=("" "### GPT-2 124M training step (batch 16 x 1024; $reps repetition(s) interleaved, median)" "")
    while IFS= read -r line; do notes+=("$line"); done <"$gdir/table.md"
  fi
  local side
  for side in trace_summary trace_summary_pytorch; do
    [ -s "$gdir/$side.txt" ] || continue
    notes+=("" "### Where the GPT step's time goes: $side.txt (tools/bench/trace_summary.py)" "" '```')
    while IFS= read -r line; do notes+=("$line"); done < <(head -n 90 "$gdir/$side.txt")
    notes+=('```')
  done
}

# sec_mp_rows: model_parallel's untimed rows.
sec_mp_rows() {
  check gpt_cuda_test 240 "$runsh" gpt_cuda_test --gtest_brief=1
  check fused_ops_cuda_test 240 "$runsh" fused_ops_cuda_test --gtest_brief=1  # the LayerNorm's __syncwarp
  check fused_models_cuda_test 240 "$runsh" fused_models_cuda_test --gtest_brief=1
  local place=(fabric.accelerator=cuda fabric.devices=1 fabric.ddp.ranks_per_gpu=2)
  [ $cpu -eq 1 ] && place=(fabric.accelerator=cpu fabric.devices=2)
  CHECK_SUMMARY='val loss|tok/s' check "gpt tiny tp 2, sequence parallel, dropout 0.1 (2 ranks)" 240 \
    "$runsh" gpt --config=gpt_tp.yaml "${place[@]}" fabric.model_parallel.tensor_parallel_size=2 \
    fabric.model_parallel.sequence_parallel=true model.dropout=0.1 trainer.max_steps=40 \
    gpt.sample_tokens=0 "logging.run_dir=$work/runs/{name}/{timestamp}" "gpt.corpus_cache=$corpus"
  # Issue 71: pipeline and context parallelism with 2 ranks on the one GPU (Gloo, the runner's
  # activations through host memory): each schedule and cp 2 against ddp on the same global
  # batch, exported weights within 1e-5 (compare_weights.py; CPU: 3.4e-7).
  local pd="$work/pp" cmpw=("$python" "$here/compare_weights.py" --tol=1e-5)
  local tiny=(--config=gpt_tiny.yaml "${place[@]}" model.n_layer=4 model.n_head=2 model.n_embd=32
              model.block_size=32 trainer.max_steps=6 scheduler.warmup_steps=2
              trainer.limit_eval_batches=2 gpt.sample_tokens=0 optimizer.name=sgd optimizer.lr=0.1
              trainer.gradient_clip_val=0.1 fabric.precision=32-true "gpt.corpus_cache=$corpus")
  CHECK_SUMMARY='val loss' check "gpt tiny ddp, 2 ranks (the pp and cp reference)" 120 "$runsh" gpt \
    "${tiny[@]}" fabric.strategy=ddp data.batch_size=4 "logging.run_dir=$pd/ddp"
  local pv
  for pv in "pp 2 1f1b|fabric.model_parallel.pipeline_parallel_size=2" \
            "pp 2 gpipe m 8|fabric.model_parallel.pipeline_parallel_size=2 fabric.pipeline.schedule=gpipe fabric.pipeline.micro_batches=8" \
            "pp 2 interleaved v 2|fabric.model_parallel.pipeline_parallel_size=2 fabric.pipeline.schedule=interleaved_1f1b fabric.pipeline.virtual_stages=2" \
            "cp 2|fabric.model_parallel.context_parallel_size=2"; do
    local pname=${pv%%|*} pflags=${pv#*|} pdir
    pdir="$pd/${pname// /_}"
    # shellcheck disable=SC2086  # the flags are words
    CHECK_SUMMARY='val loss' check "gpt tiny $pname (2 ranks)" 120 "$runsh" gpt "${tiny[@]}" \
      fabric.strategy=model_parallel data.batch_size=8 $pflags "logging.run_dir=$pdir" &&
      CHECK_SUMMARY='max_rel|bitwise' check "gpt tiny $pname = ddp (weights)" 60 "${cmpw[@]}" \
        "$pdir/weights.pt" "$pd/ddp/weights.pt"
  done
  local pd="$work/pp" cmpw=("$python" "$here/compare_weights.py" --tol=1e-5)
  local place=(fabric.accelerator=cuda fabric.devices=1 fabric.ddp.ranks_per_gpu=2)
  [ $cpu -eq 1 ] && place=(fabric.accelerator=cpu fabric.devices=2)
  # Issue 70: fsdp's cpu_offload on CUDA (pinned host shards, gradients and AdamW state; the
  # fused CPU step): weights bitwise those without it; each run's peak device bytes (the max
  # over ranks, summary.json's peak_tensor_bytes) side by side.
  local off=(--config=gpt_tiny.yaml "${place[@]}" model.n_layer=8 model.n_head=8 model.n_embd=512
             model.block_size=128 trainer.max_steps=6 trainer.limit_eval_batches=2
             gpt.sample_tokens=0 optimizer.name=adamw fabric.precision=bf16-mixed
             fabric.strategy=fsdp fabric.fsdp.wrap_modules=Block data.batch_size=8
             "gpt.corpus_cache=$corpus")
  local ov
  for ov in false true; do
    CHECK_SUMMARY='val loss' check "gpt 25M fsdp cpu_offload=$ov (2 ranks)" 180 "$runsh" gpt \
      "${off[@]}" "fabric.fsdp.cpu_offload=$ov" "logging.run_dir=$pd/offload_$ov"
  done
  CHECK_SUMMARY='bitwise|max_rel' check "gpt 25M fsdp cpu_offload = without (weights)" 60 \
    "${cmpw[@]}" --bitwise "$pd/offload_true/weights.pt" "$pd/offload_false/weights.pt"
  CHECK_SUMMARY='peak' check "gpt 25M fsdp peak device bytes, without / with cpu_offload" 30 \
    "$python" -c 'import json, sys
a, b = (json.load(open(f + "/summary.json")).get("peak_tensor_bytes") for f in sys.argv[1:])
print("peak device bytes per rank: %s without cpu_offload, %s with" % (a, b))' \
    "$pd/offload_false" "$pd/offload_true"
}

# sec_bubble: the pipeline bubble (timed).
sec_bubble() {
  # Issue 72 item 4: the schedules' bubble measured on the GPU (pipeline_bubble: 2 ranks on
  # cuda:0 over Gloo, float32, the stream synchronized at each timestamp): GPipe, 1F1B and
  # interleaved 1F1B at m = 8 and 16, 8 blocks of width 1024, micro-batches of 4 x 256 tokens.
  local bflags=(--device=cuda --micro_batches=8,16 --layers=8 --width=1024 --micro_batch_size=4
                --seq=256 --steps=5)
  [ $cpu -eq 1 ] && bflags=(--device=cpu --micro_batches=4 --steps=2)
  if CHECK_SUMMARY='^pp=' check "pipeline_bubble pp 2" 120 "$runsh" pipeline_bubble --pp=2 "${bflags[@]}"; then
    notes+=("" "### Pipeline bubble, pp 2 (pipeline_bubble --pp=2 ${bflags[*]})" "" '```')
    while IFS= read -r line; do notes+=("$line"); done < <(sed -n '/^pp=/,$p' "$work/logs/pipeline_bubble pp 2.log")
    notes+=('```')
  fi
}

# sec_fp8_tests: fp8's kernel tests.
sec_fp8_tests() {
  check fp8_cuda_test 240 "$runsh" fp8_cuda_test --gtest_brief=1
  check fp8_nodes_cuda_test 240 "$runsh" fp8_nodes_cuda_test --gtest_brief=1
}

# sec_fp8_speed: fp8 against bf16 (timed).
sec_fp8_speed() {
  local m b spec extra
  for spec in "gpt2-medium 16 ,ours-fp8-delayed-tilegrid,ours-graphs,ours-fp8-delayed-graphs,ours-eager-accum4,ours-fp8-delayed-accum4,ours-fp8-delayed-accum4-nocache" \
              "gpt2-xl 8 ,ours-fp8-delayed-tilegrid"; do
    read -r m b extra <<<"$spec"
    local mflags=(--reps="$reps" --model="$m" --batch="$b" --steps=15 --warmup=6
                  --sides=ours-eager,ours-fp8,ours-fp8-delayed$extra --base=ours-eager
                  --profile=ours-fp8-delayed)
    [ $cpu -eq 1 ] && m=gpt-tiny b=4 && mflags+=(--device=cpu --model=gpt-tiny --batch=4 --steps=2
                               --warmup=1 --precision=32-true
                               --sides=ours-eager,ours-fp8,ours-fp8-delayed${extra%%,ours-graphs*}
                               --profile=)
    CHECK_SUMMARY='^\| ours' check "fp8 vs bf16, $m" 580 "$here/bench/gpt_compare.sh" "$work/throughput" \
      "$here/bench/gpt_reference.py" "$work/fp8_$m" "${mflags[@]}"
    if [ -s "$work/fp8_$m/table.md" ]; then
      notes+=("" "### fp8-mixed vs bf16-mixed, $m (batch $b x 1024; $reps repetition(s) interleaved, median)" "")
      while IFS= read -r line; do notes+=("$line"); done <"$work/fp8_$m/table.md"
    fi
    if [ -s "$work/fp8_$m/trace_summary.txt" ]; then
      notes+=("" "### Where the fp8 step's time goes, $m (trace_summary.py)" "" '```')
      while IFS= read -r line; do notes+=("$line"); done < <(head -n 60 "$work/fp8_$m/trace_summary.txt")
      notes+=('```')
    fi
  done
}

# sec_fp8_loss: fp8's 200-step loss.
sec_fp8_loss() {
  # The loss over the first 200 steps (issue 72 item 2: within 1% of bf16-mixed's), gpt2-medium's
  # shape on the byte corpus, one process: bf16-mixed, fp8 tensorwise, fp8 delayed.
  local ld="$work/fp8_loss" lp lname
  local lflags=(--config=gpt2.yaml model.preset=gpt2-medium fabric.accelerator=cuda
                fabric.devices=1 trainer.max_steps=200 trainer.accumulate_grad_batches=1
                scheduler.warmup_steps=20 gpt.eval_every_n_steps=50 trainer.limit_eval_batches=8
                gpt.sample_tokens=0 "gpt.corpus_cache=$corpus")
  [ $cpu -eq 1 ] && lflags=(--config=gpt_tiny.yaml fabric.accelerator=cpu fabric.devices=1
                            model.n_layer=2 model.n_head=2 model.n_embd=32 model.block_size=32
                            data.batch_size=8 trainer.max_steps=20 scheduler.warmup_steps=2
                            gpt.eval_every_n_steps=10 trainer.limit_eval_batches=2
                            gpt.sample_tokens=0 "gpt.corpus_cache=$corpus")
  # Last, the yardstick: bf16-mixed from another seed (init and data order), i.e. how far a run
  # lands from bf16-mixed's with nothing but chance changed (fabric.seed's default is 42).
  for lp in "bf16-mixed|fabric.precision=bf16-mixed" "fp8 tensorwise|fabric.precision=fp8-mixed" \
            "fp8 delayed|fabric.precision=fp8-mixed fabric.fp8.recipe=delayed" \
            "bf16-mixed seed 43|fabric.precision=bf16-mixed fabric.seed=43"; do
    lname=${lp%%|*}
    # shellcheck disable=SC2086  # the side's keys, split on purpose
    CHECK_SUMMARY='val loss' check "fp8 loss, $lname" 300 "$runsh" gpt "${lflags[@]}" ${lp#*|} \
      "logging.run_dir=$ld/${lname// /_}"
  done
  local ltable
  if ltable=$("$python" - "$ld" <<'PY'
import csv, os, sys
root = sys.argv[1]
sides = ["bf16-mixed", "fp8_tensorwise", "fp8_delayed", "bf16-mixed_seed_43"]
loss = {}
for side in sides:
    path = os.path.join(root, side, "metrics.csv")
    if not os.path.exists(path):
        continue
    with open(path) as f:
        loss[side] = {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}
base = loss.get("bf16-mixed", {})
if not base:
    sys.exit(1)
print("| step | " + " | ".join(s.replace("_", " ") for s in sides) + " |")
print("|---|" + "---|" * len(sides))
for step in sorted(base):
    cells = []
    for side in sides:
        v = loss.get(side, {}).get(step)
        cells.append("" if v is None else "%.5f" % v if side == "bf16-mixed"
                     else "%.5f (%+.2f%%)" % (v, 100 * (v / base[step] - 1)))
    print("| %d | %s |" % (step, " | ".join(cells)))
gaps = []
for side in sides[1:]:
    d = [abs(v / base[s] - 1) for s, v in loss.get(side, {}).items() if s in base]
    if d:
        gaps.append("%s %.2f%%" % (side.replace("_", " "), 100 * max(d)))
print("")
print("Largest gap from bf16-mixed over the evaluations: " + ", ".join(gaps))
PY
  ); then
    notes+=("" "### fp8 loss vs bf16-mixed, first 200 steps (val loss; issue 72 item 2: within 1%)" ""
            "Seed 43's column is the yardstick: bf16-mixed with another init and data order." "")
    while IFS= read -r line; do notes+=("$line"); done <<<"$ltable"
  fi
}

# sec_pretrained: the pretrained or titan steps (timed).
sec_pretrained() {
  # Issue 69 item 7: each step of tools/bench/llama_gpu_bench.sh one row (state in $work/pretrained).
  local pdir="$work/pretrained" pflags=() st
  [ $cpu -eq 1 ] && pflags+=(--cpu)
  # torch.compile last: the slowest and least sure (its limit keeps the suite inside 10 minutes).
  local steps_run=("pylib 90" "make 240" "tokens 60" "ours-train 240" "hf-train 240" "ours-decode 150"
                   "ours-decode-bf16 150" "hf-decode 150" "hf-decode-bf16 150" "ours-lora 180"
                   "peft-lora 180" "torchtitan 180" "hf-compile 300" "torchtitan-compile 300" "table 30")
  # --suite=titan (issue 72 item 3): ours against TorchTitan only, bf16 and float8.
  [ $titan -eq 1 ] &&
    steps_run=("pylib 90" "make 240" "tokens 60" "ours-train 180" "ours-train-unfused 180"
               "ours-train-fp8 180" "ours-train-fp8-delayed 180" "torchtitan 150"
               "torchtitan-fp8 150" "torchtitan-compile 240" "torchtitan-fp8-compile 240" "table 30")
  for st in "${steps_run[@]}"; do
    read -r name limit <<<"$st"
    # --suite=titan in two calls of at most 10 minutes: --skip=titan_compile, then
    # --skip=titan_eager (every row but the compiled ones and the table) with the same --work
    # on the warm node, whose model folder, tokens, installed wheels and rows it reuses.
    if [ $titan -eq 1 ]; then
      case $name in
        *-compile) skipping titan_compile && continue ;;
        table) ;;
        *) skipping titan_eager && continue ;;
      esac
    fi
    CHECK_SUMMARY='^(rate: |transformers |using |prepare_text: |.*parameters .* save )' check "pretrained $name" "$limit" \
      "$here/bench/llama_gpu_bench.sh" "$name" "$here" "$pdir" "${pflags[@]}"
  done
  if [ -s "$pdir/table.md" ]; then
    local heading="ours vs transformers (issue 69 item 7)"
    [ $titan -eq 1 ] && heading="ours vs TorchTitan, bf16 and float8 (issue 72 item 3)"
    notes+=("" "### Llama-3.2-1B-shaped random model: $heading" "")
    while IFS= read -r line; do notes+=("$line"); done <"$pdir/table.md"
  fi
}

# report: the markdown report of run's rows and notes (run's variables).
report() {
  echo "# GPU check: ${gpu}"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ); host: $(hostname); driver: ${driver:-n/a}; python torch: $torch"
  echo "- bundle: $(sed -n 's/^revision=//p' "$here/MANIFEST") (torch $(sed -n 's/^torch=//p' "$here/MANIFEST"))"
  [ $cpu -eq 1 ] && echo "- **no GPU used** (--cpu, or torch.cuda.is_available() is false): CPU checks only; GPU paths NOT verified"
  echo "- result: $passed passed, $failed failed, $skipped skipped (a skipped test proves nothing)"
  echo "- logs: $work/logs"
  echo
  echo "| check | result | seconds | note |"
  echo "| --- | --- | --- | --- |"
  printf '%s\n' "${rows[@]}"
  [ ${#notes[@]} -eq 0 ] || printf '%s\n' "${notes[@]}"
}

# _then COMMAND... -- CHECK...: runs COMMAND, then (when it succeeded) CHECK; the status of the
# first that fails.
then_() {
  local first=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do first+=("$1"); shift; done
  shift
  "${first[@]}" || return
  "$@"
}

# _resume_auto RUNSH DIR ARGS...: cifar10 (ARGS, their trainer.max_steps replaced) for 10 steps
# with an async checkpoint every 10, then again for 20 with checkpoint.resume=auto, which must
# resume from that checkpoint at step 10.
resume_auto() {
  local runsh=$1 dir=$2 a args=()
  shift 2
  for a in "$@"; do [[ "$a" == trainer.max_steps=* || "$a" == logging.run_dir=* ]] || args+=("$a"); done
  args+=("logging.run_dir=$dir/{timestamp}" checkpoint.every_n_steps=10 checkpoint.async=true)
  "$runsh" cifar10 --config=single_gpu.yaml "${args[@]}" trainer.max_steps=10 || return
  local out rc
  out=$("$runsh" cifar10 --config=single_gpu.yaml "${args[@]}" trainer.max_steps=20 checkpoint.resume=auto 2>&1)
  rc=$?
  echo "$out"
  [ $rc -eq 0 ] || return $rc
  grep -q 'resumed from .*step-00000010.ckpt at step 10' <<<"$out" ||
    { echo "the second run did not resume from the first one's checkpoint of step 10"; return 1; }
}

# _restart RUNSH DIR REFERENCE ARGS...: cifar10 with ARGS and fabric.max_restarts=1; once the
# checkpoint of step 8 exists, rank 1 of the first attempt is SIGKILLed; the job must restart,
# finish, and write weights bitwise REFERENCE.
restart() {
  local runsh=$1 dir=$2 reference=$3
  shift 3
  rm -rf "$dir"
  "$runsh" cifar10 "$@" fabric.max_restarts=1 fabric.restart_backoff_s=0 \
    "logging.run_dir=$dir/{timestamp}" >"$dir.log" 2>&1 &
  local job=$! victim="" i p
  for ((i = 0; i < 6000; i++)); do
    if [ -n "$(find "$dir" -name step-00000008.ckpt 2>/dev/null)" ]; then
      # This job's ranks only (their command lines name its run folder): a --parallel lane may
      # run other cifar10 jobs beside it.
      for p in $(pgrep -f "bin/cifar10 .*logging.run_dir=$dir/"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'FABRIC_LOCAL_RANK=1' || continue
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^FABRIC_RESTART_COUNT=[1-9]' && continue
        victim=$p
      done
      break
    fi
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  [ -n "$victim" ] && kill -9 "$victim"
  wait "$job"
  local rc=$?
  cat "$dir.log"
  [ -n "$victim" ] || { echo "rank 1 was not found running after the checkpoint of step 8"; return 1; }
  [ $rc -eq 0 ] || return $rc
  grep -q 'restart 1 of 1' "$dir.log" || { echo "no restart happened"; return 1; }
  local weights
  weights=$(find "$dir" -name weights.pt | head -n 1)
  "${PYTHON:-python3}" "$here/compare_weights.py" --bitwise "$weights" "$reference"
}

case "$mode" in
  build) build "$@" ;;
  run) run "$@" ;;
  _then) then_ "$@" ;;
  _resume_auto) resume_auto "$@" ;;
  _restart) restart "$@" ;;
  *) usage ;;
esac
