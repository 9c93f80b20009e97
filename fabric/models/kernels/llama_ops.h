// C interface of the Llama family's elementwise kernels (llama_ops.cu, compiled by nvcc when the
// build has one: tools/bazel/cuda.bzl). No CUDA or LibTorch types; fabric/models/fused_llama_ops.cc
// calls them. Every value is 16-bit (`type`); each kernel computes in float32 the operations of
// the ATen operators it replaces and rounds to `type` where they round (their values, bitwise
// where both compilations evaluate the float32 expressions alike: gpt_cuda_test counts).
#ifndef FABRIC_MODELS_KERNELS_LLAMA_OPS_H_
#define FABRIC_MODELS_KERNELS_LLAMA_OPS_H_

#include <cstdint>

#include "fabric/models/kernels/cross_entropy.h"  // LogitType: the 16-bit element types

namespace fabric::kernels {

// Strides (in elements) of a [B, H, T, D] tensor's first three dimensions; D's is 1.
struct RotaryStrides {
  int64_t b, h, t;
};

// Rotary position embedding (Hugging Face's rotate_half convention: element j pairs with
// j + D/2) over rows (b, h, t) of D 16-bit values, cos and sin [T, D] float32 contiguous:
//   forward:  y = x · cos + rotate_half(x) · sin, rotate_half(x) = [-x[D/2:], x[:D/2]], in
//             float32, rounded once to `type` (ATen's float32 result, cast as autocast casts it
//             for the attention)
//   backward: y = x · cos + rotate_half_t(x · sin), rotate_half_t(v) = [v[D/2:], -v[:D/2]] (x the
//             output's gradient, y the input's), each product and the sum rounded to `type`
//             (autograd's casts to the input's dtype, then its sum).
// D must be a multiple of 8; x and y 8-byte aligned, their rows' strides multiples of 4; cos and
// sin 16-byte aligned. Returns 0 or the cudaError_t of the launch.
int rotary(const void* x, RotaryStrides xs, void* y, RotaryStrides ys, const float* cos,
           const float* sin, int64_t batch, int64_t heads, int64_t seq, int64_t dim, bool backward,
           LogitType type, void* stream);

// SwiGLU over n contiguous values: y = silu(gate) · up, silu's output rounded to `type` before
// the product (torch::silu then mul).
int swiglu_forward(const void* gate, const void* up, void* y, int64_t n, LogitType type,
                   void* stream);

// Its backward from dy: dgate = silu'(gate) · (dy · up), dup = dy · silu(gate), with ATen's
// roundings (mul's backward products, then silu_backward's float32 formula).
int swiglu_backward(const void* dy, const void* gate, const void* up, void* dgate, void* dup,
                    int64_t n, LogitType type, void* stream);

}  // namespace fabric::kernels

#endif  // FABRIC_MODELS_KERNELS_LLAMA_OPS_H_
