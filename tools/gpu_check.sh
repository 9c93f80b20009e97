#!/usr/bin/env bash
# One command to verify the CUDA paths on a GPU node that has PyTorch in Python but no Bazel.
#
#   tools/gpu_check.sh build [--out=DIR]      here, with Bazel: writes the bundle (default
#                                             .device/gpu_check; must stay <= 64 MiB)
#   DIR/gpu_check.sh run [flags]              on the node: runs the checks, prints a markdown report
#                                             to stdout (progress on stderr)
#
# The bundle (//tools:bundle with its default targets) holds every test tagged `gpu` with the
# helper they start, the examples, //tools:env, the throughput benchmark; gpu_check adds the
# benchmark's Python side (tools/bench/*.py) and this script. `run` does, in order, each with its own time limit (the whole run stays under 9 minutes
# on an H100):
#   1. env          DIR/run.sh env: LibTorch, CUDA, cuDNN, NCCL, devices, what Fabric would set up
#   2. gpu tests    every GPU-tagged test binary (gtest); a test that skips is reported as skipped
#   3. examples     cifar10 (synthetic data) with single_gpu / amp / bf16 / ddp_amp on one GPU
#                   (NCCL world size 1) / single_gpu and ddp_amp + fabric.cuda_graphs / dp on one
#                   visible GPU (falls back to single_device), a few steps each
#   4. throughput   tools/bench/gpu_compare.py: ours (eager and CUDA graphs) vs the raw PyTorch loop
#                   vs Lightning Fabric, ResNet-18 CIFAR, reduced repetitions
# Without a usable GPU (or with --cpu) it runs what a CPU can: env, the GPU tests (they must load
# and skip), one example on CPU and the throughput binary on CPU; tools/ci_checks.sh runs this on
# every CI run so the bundle keeps building, relocating and running.
#
# run flags: --cpu (CPU checks only), --steps=N (example steps, default 20), --reps=N (throughput
#   repetitions, default 1), --skip=SECTION[,SECTION] (env, tests, examples, throughput),
#   --work=DIR (scratch folder for run directories; default a new temporary folder).
# Exit status: 0 every check passed (skips allowed); 1 some check failed; 2 usage error.
set -uo pipefail

usage() {
  echo "usage: tools/gpu_check.sh build [--out=DIR] | DIR/gpu_check.sh run [--cpu] [--steps=N] [--reps=N] [--skip=LIST] [--work=DIR]" >&2
  exit 2
}
[ $# -ge 1 ] || usage
mode=$1
shift
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

limit_mib=64

build() {
  local out=""
  for arg in "$@"; do
    case "$arg" in
      --out=*) out=${arg#--out=} ;;
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
  bazel run --noshow_progress //tools:bundle -- --out="$out" >&2 || exit 1
  mkdir -p "$out/bench"
  cp tools/bench/gpu_compare.py tools/bench/throughput.py tools/bench/models.py tools/bench/trace_summary.py "$out/bench/"
  cp tools/gpu_check.sh "$out/gpu_check.sh"
  chmod +x "$out/gpu_check.sh"
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

# check NAME LIMIT_S COMMAND...: runs it with output in $work/logs/NAME.log; records a row.
# A gtest binary that skipped tests (and ran none) counts as skipped.
check() {
  local name=$1 limit=$2
  shift 2
  local log="$work/logs/$name.log" t0 t1 rc status note
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
  elif [ $rc -ne 0 ]; then
    status=FAILED
    note="exit $rc: $(grep -m1 -E 'Failure|FAILED|[Ee]rror' "$log" | cut -c1-200)"
    [ -n "$note" ] || note="exit $rc: $(tail -n 1 "$log" | cut -c1-200)"
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
}

run() {
  local cpu=0 steps=20 reps=1 skip="" 
  work=""
  for arg in "$@"; do
    case "$arg" in
      --cpu) cpu=1 ;;
      --steps=*) steps=${arg#--steps=} ;;
      --reps=*) reps=${arg#--reps=} ;;
      --skip=*) skip=${arg#--skip=} ;;
      --work=*) work=${arg#--work=} ;;
      *) echo "gpu_check run: unknown argument '$arg'" >&2; usage ;;
    esac
  done
  [[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check run: --steps must be a positive integer" >&2; exit 2; }
  [[ "$reps" =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check run: --reps must be a positive integer" >&2; exit 2; }
  [ -x "$here/run.sh" ] && [ -f "$here/MANIFEST" ] ||
    { echo "gpu_check run: $here is not a bundle (no run.sh/MANIFEST); build one with 'tools/gpu_check.sh build'" >&2; exit 2; }
  [ -n "$work" ] || work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
  mkdir -p "$work/logs" "$work/tests/integration" || exit 1
  # Tests start their helpers from the helper's package folder under the working directory
  # (Bazel's runfiles layout; fabric::testing::helper_binary in tests/run_command.h).
  for helper in ddp_parity_helper; do
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

  if ! skipping tests; then
    local t
    for t in $(sed -n 's/^binaries=//p' "$here/MANIFEST"); do
      [[ "$t" == *_test ]] || continue
      check "$t" 240 "$runsh" "$t" --gtest_brief=1
    done
  fi

  local common=(trainer.max_epochs=1 "trainer.max_steps=$steps" trainer.limit_eval_batches=2
                data.synthetic=true data.synthetic_train_size=6400 data.synthetic_test_size=512
                logging.log_every_n_steps=10 "logging.run_dir=$work/runs/{name}/{timestamp}"
                checkpoint.every_n_epochs=0)
  if ! skipping examples; then
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
    fi
  fi

  if ! skipping throughput; then
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
  fi

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
  [ $failed -eq 0 ]
}

case "$mode" in
  build) build "$@" ;;
  run) run "$@" ;;
  *) usage ;;
esac
