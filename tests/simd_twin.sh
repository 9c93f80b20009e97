#!/usr/bin/env bash
# A parity test again with LibTorch's and oneDNN's CPU kernels held to AVX2 (8-wide float vectors),
# whatever this machine has: a parity that holds at one SIMD width only fails on every machine
# (tests/defs.bzl, simd_twin).
#   simd_twin.sh TEST_BINARY [ARGS...]
set -euo pipefail
exec env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 "$@"
