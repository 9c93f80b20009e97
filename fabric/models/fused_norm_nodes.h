// The fused LayerNorm/RMSNorm kernels as autograd nodes (fused_norm_nodes.cc), which
// fused_layer_norm.cc's functions run where they apply. Internal to
// //fabric/models:fused_layer_norm.
#ifndef FABRIC_MODELS_FUSED_NORM_NODES_H_
#define FABRIC_MODELS_FUSED_NORM_NODES_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

#include "fabric/models/fused_layer_norm.h"

namespace fabric::models::detail {

// Autocast's 16-bit dtype for x (bf16 or fp16, CUDA autocast on and x on CUDA), else Undefined.
at::ScalarType autocast_16(const at::Tensor& x);

#ifdef FABRIC_WITH_CUDA_KERNELS
// Whether x's device gives a block the shared memory the backward kernel needs for `cols` (else
// the launch would fail: the ATen path runs instead).
bool backward_fits(const at::Tensor& x, int64_t cols, bool rms);

// The nodes, in autocast_16(x): an undefined bias is RMSNorm. norm_16: LayerNorm(x);
// keep_norm: {x through the node, LayerNorm(x)}; add_norm: {x + delta, LayerNorm(x + delta)}
// (fused_layer_norm.h). target (may be null): the output's float8 bytes (a stand-in returned for
// it), or its amax alone (tensorwise).
at::Tensor norm_16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   double eps);
std::pair<at::Tensor, at::Tensor> keep_norm(const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& bias, double eps,
                                            const NormFp8Target* target);
std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& x, const at::Tensor& delta,
                                           const at::Tensor& weight, const at::Tensor& bias,
                                           double eps, const NormFp8Target* target);
#endif

}  // namespace fabric::models::detail

#endif  // FABRIC_MODELS_FUSED_NORM_NODES_H_
