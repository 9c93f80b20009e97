// fabric::models::linear_cross_entropy: the loss of a language model's output layer without its
// float32 logits.
//
// The mean cross-entropy of logits = h · weightᵀ against targets. On a CUDA device with 16-bit
// compute (autocast bf16/fp16, or 16-bit h), and when the build compiled Fabric++'s kernels
// (FABRIC_WITH_CUDA_KERNELS, tools/bazel/cuda.bzl), it runs as one autograd function: the 16-bit
// logits GEMM, one kernel that computes each row's loss in float32 and overwrites the logits with
// their gradient, and in backward the two GEMMs of the gradient. Otherwise (CPU, float32, no
// nvcc at build time, or fused = false) it is lm_loss(linear(h, weight), targets), the same math
// through ATen. Both compute in float32 from the same 16-bit logits; they differ only in rounding.
//
//   torch::Tensor loss = fabric::models::linear_cross_entropy(hidden, model->wte->weight, targets);
#ifndef FABRIC_MODELS_FUSED_CROSS_ENTROPY_H_
#define FABRIC_MODELS_FUSED_CROSS_ENTROPY_H_

#include <ATen/core/Tensor.h>

namespace fabric::models {

// Mean cross-entropy of next-token logits [..., V] against targets [...] (int64 ids in [0, V), or
// -100): float32 math; float16 CUDA logits are read by the softmax kernel without a float32 copy.
// A target -100 is ignored (at::cross_entropy_loss's and at::nll_loss's default ignore_index):
// its row adds nothing to the loss or the gradient, and the mean is over the other rows (NaN if
// every row is ignored).
at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets);

// h [..., C], weight [V, C], targets [...]: lm_loss(h · weightᵀ, targets), fused where it can be
// (see above). Both paths ignore targets -100 in the same way (loss, gradient and the count the
// mean divides by, NaN if every row is ignored); the fused path keeps that count on the device
// and never synchronizes with the host. With the fused path any other target outside [0, V)
// makes the loss NaN (its gradient row is zero); ATen's path raises an error on the CPU and a
// device-side assert on CUDA.
at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight,
                                const at::Tensor& targets, bool fused = true);

// Whether linear_cross_entropy(h, ...) would take the fused path for this h now (device, autocast
// state, dtype, and whether the kernels were built).
bool fused_cross_entropy_applies(const at::Tensor& h);

// Whether this build has Fabric++'s CUDA kernels (nvcc found at build time).
bool cuda_kernels_built();

}  // namespace fabric::models

#endif  // FABRIC_MODELS_FUSED_CROSS_ENTROPY_H_
