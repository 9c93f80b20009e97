#!/usr/bin/env bash
# A parity test again with LibTorch's and oneDNN's CPU kernels held to AVX2 (8-wide float vectors),
# whatever this machine has: a parity that holds at one SIMD width only fails on every machine
# (tests/defs.bzl, simd_twin).
#   simd_twin.sh TEST_BINARY [ARGS...]
# On a CPU without AVX-512 or AVX-VNNI, AVX2 is already what both libraries pick: the test itself
# ran these kernels, so the twin says so and passes without running them a second time (on a
# 2-vCPU AVX2 AMD EPYC: about 115 s of CI's test time).
set -euo pipefail
if ! grep -qwE 'avx512f|avx_vnni' /proc/cpuinfo 2>/dev/null && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
  echo "simd_twin: this CPU's widest kernels are AVX2 already: $(basename "$1") itself ran them"
  exit 0
fi
exec env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "$@"
