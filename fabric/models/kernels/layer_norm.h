// C interface of the LayerNorm kernels (layer_norm.cu, compiled by nvcc when the build has one:
// tools/bazel/cuda.bzl). No CUDA or LibTorch types; fabric/models/fused_layer_norm.cc calls them.
#ifndef FABRIC_MODELS_KERNELS_LAYER_NORM_H_
#define FABRIC_MODELS_KERNELS_LAYER_NORM_H_

#include <cstdint>

#include "fabric/models/kernels/cross_entropy.h"  // LogitType: the 16-bit element types

namespace fabric::kernels {

// Where the forward kernels below write their output as float8 instead (fp8-mixed under delayed
// scaling: the next Linear's input cast taken by the norm, so y is never written in 16 bits and
// read again). Each value of y, rounded to `type` as y would hold it, is multiplied by
// s = 448 / max(a, 1e-12), a the largest finite entry of history[0 .. history_len) (non-finite
// ones count as 0), and written to q (rows × cols, row-major) as float8 e4m3fn, saturated: the
// bytes fabric/nn/kernels/fp8_cast.h's fp8_cast_delayed writes from y (margin 0). inverse (not
// null) receives 1 / s; record (may be null; must hold 0 or less) the largest |y| as an atomic
// maximum (NaN when y holds one). With q null, y is written as usual; and record (when not
// null) receives the largest |y|, as y holds it, the same way (a tensorwise cast of y then needs
// no pass of its own for it).
struct LayerNormFp8Out {
  uint8_t* q = nullptr;
  const float* history = nullptr;
  int history_len = 0;  // >= 1 when q is given, else cudaErrorInvalidValue
  float* record = nullptr;
  float* inverse = nullptr;
};

// Rows of `cols` float32 values (row-major, contiguous; cols % 4 == 0). For each row r:
// h = x + delta (delta: 16-bit of `type`, or null for h = x; h written only when delta is given,
// to `h`), mean[r], rstd[r] = 1 / sqrt(var + eps) (biased variance), and
// y = (h - mean) · rstd · weight + bias in `type` (f8.q given: as float8, y not written).
// Returns 0 or the cudaError_t of the launch.
int layer_norm_forward(const float* x, const void* delta, float* h, const float* weight,
                       const float* bias, void* y, float* mean, float* rstd, int64_t rows,
                       int64_t cols, float eps, LogitType type, void* stream,
                       const LayerNormFp8Out& f8 = {});

// Backward of the above: dy (16-bit), h (the normalized input), mean, rstd, weight; dh_in
// (float32, may be null) is the gradient h already has from elsewhere (the residual path). Writes
// dh = dh_in + ∂loss/∂h (float32), dh16 (the same in `type`, when not null), and the gradients of
// weight and bias, summed over rows in a fixed order (deterministic), through `workspace` of
// layer_norm_workspace_floats(rows, cols) floats.
int layer_norm_backward(const void* dy, const float* h, const float* mean, const float* rstd,
                        const float* weight, const float* dh_in, float* dh, void* dh16,
                        float* dweight, float* dbias, float* workspace, int64_t rows, int64_t cols,
                        LogitType type, void* stream);
int64_t layer_norm_workspace_floats(int64_t rows, int64_t cols);

// The shared memory a block of layer_norm_backward (rms: rms_norm_backward) uses for `cols`: each
// warp keeps its weight (and bias) sums. Above 48 KiB the launch asks for the device's opt-in
// maximum, and fails on a device with less (99 KiB on sm_86/sm_89, 227 KiB on Hopper).
int64_t layer_norm_backward_shared_bytes(int64_t cols, bool rms);

// RMSNorm (the Llama family's): as the two above without the mean and the bias: rstd[r] =
// 1 / sqrt(mean(h²) + eps), y = weight · (h · rstd) in `type` (or float8, as above); backward
// writes dh (+ dh_in, and dh16 when not null) and dweight, through a workspace of
// layer_norm_workspace_floats(rows, cols) floats (it uses half of it).
int rms_norm_forward(const float* x, const void* delta, float* h, const float* weight, void* y,
                     float* rstd, int64_t rows, int64_t cols, float eps, LogitType type,
                     void* stream, const LayerNormFp8Out& f8 = {});
int rms_norm_backward(const void* dy, const float* h, const float* rstd, const float* weight,
                      const float* dh_in, float* dh, void* dh16, float* dweight, float* workspace,
                      int64_t rows, int64_t cols, LogitType type, void* stream);

}  // namespace fabric::kernels

#endif  // FABRIC_MODELS_KERNELS_LAYER_NORM_H_
