#include "fabric/models/fused_layer_norm.h"

#include <ATen/ATen.h>

#include <string>

#include "fabric/core/error.h"
#include "fabric/models/fused_norm_nodes.h"
#include "fabric/nn/fp8.h"

namespace fabric::models {
namespace {

using detail::autocast_16;

// The _fp8 functions' refusal where their kernel does not apply (`applies`: the test that failed).
[[noreturn]] void refuse(const char* function, const char* norm, const at::Tensor& x,
                         const char* applies) {
  throw Error(std::string(function) + ": the fused " + norm + " does not apply to " +
              c10::str(x.sizes()) + " on " + x.device().str() + " (" + applies + ")");
}

}  // namespace

bool layer_norm_applies(const at::Tensor& x, const torch::nn::LayerNorm& ln) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  const auto& shape = ln->options.normalized_shape();
  const int64_t cols = x.dim() > 0 ? x.size(-1) : 0;
  return autocast_16(x) != at::ScalarType::Undefined && x.scalar_type() == at::kFloat &&
         shape.size() == 1 && shape[0] == cols && cols % 4 == 0 && cols <= 2048 &&
         ln->options.elementwise_affine() && ln->weight.defined() && ln->bias.defined() &&
         ln->weight.scalar_type() == at::kFloat && ln->bias.scalar_type() == at::kFloat &&
         ln->weight.is_cuda() && detail::backward_fits(x, cols, /*rms=*/false);
#else
  (void)x;
  (void)ln;
  return false;
#endif
}

at::Tensor layer_norm_16(const at::Tensor& x, const torch::nn::LayerNorm& ln) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (layer_norm_applies(x, ln)) return detail::norm_16(x, ln->weight, ln->bias, ln->options.eps());
#endif
  return ln.ptr()->forward(x);
}

std::pair<at::Tensor, at::Tensor> keep_layer_norm_16(const at::Tensor& x,
                                                     const torch::nn::LayerNorm& ln) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (layer_norm_applies(x, ln)) {
    return detail::keep_norm(x, ln->weight, ln->bias, ln->options.eps(), nullptr);
  }
#endif
  return {x, ln.ptr()->forward(x)};
}

bool add_layer_norm_applies(const at::Tensor& x, const at::Tensor& delta,
                            const torch::nn::LayerNorm& ln) {
  return layer_norm_applies(x, ln) && delta.sizes() == x.sizes() &&
         delta.scalar_type() == autocast_16(x);
}

std::pair<at::Tensor, at::Tensor> keep_layer_norm_fp8(const at::Tensor& x,
                                                      const torch::nn::LayerNorm& ln,
                                                      const NormFp8Target& target) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (layer_norm_applies(x, ln)) {
    return detail::keep_norm(x, ln->weight, ln->bias, ln->options.eps(), &target);
  }
#endif
  (void)target;
  refuse("keep_layer_norm_fp8", "LayerNorm", x, "layer_norm_applies");
}

std::pair<at::Tensor, at::Tensor> add_layer_norm_fp8(const at::Tensor& x, const at::Tensor& delta,
                                                     const torch::nn::LayerNorm& ln,
                                                     const NormFp8Target& target) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (add_layer_norm_applies(x, delta, ln)) {
    return detail::add_norm(x, delta, ln->weight, ln->bias, ln->options.eps(), &target);
  }
#endif
  (void)delta;
  (void)target;
  refuse("add_layer_norm_fp8", "LayerNorm", x, "add_layer_norm_applies");
}

std::pair<at::Tensor, at::Tensor> add_layer_norm_16(const at::Tensor& x, const at::Tensor& delta,
                                                    const torch::nn::LayerNorm& ln) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (add_layer_norm_applies(x, delta, ln)) {
    return detail::add_norm(x, delta, ln->weight, ln->bias, ln->options.eps(), nullptr);
  }
#endif
  at::Tensor h = x + delta;
  return {h, ln.ptr()->forward(h)};
}

at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const at::Tensor x32 = x.to(at::kFloat);
  const at::Tensor normed = x32 * at::rsqrt(x32.pow(2).mean(-1, true) + eps);
  return weight * normed.to(x.scalar_type());
}

bool rms_norm_applies(const at::Tensor& x, const at::Tensor& weight) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  const int64_t cols = x.dim() > 0 ? x.size(-1) : 0;
  return autocast_16(x) != at::ScalarType::Undefined && x.scalar_type() == at::kFloat &&
         cols % 4 == 0 && cols > 0 && cols <= kMaxRmsNormWidth && weight.defined() &&
         weight.dim() == 1 && weight.size(0) == cols && weight.scalar_type() == at::kFloat &&
         weight.is_cuda() && detail::backward_fits(x, cols, /*rms=*/true);
#else
  (void)x;
  (void)weight;
  return false;
#endif
}

at::Tensor rms_norm_16(const at::Tensor& x, const at::Tensor& weight, double eps) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (rms_norm_applies(x, weight)) return detail::norm_16(x, weight, at::Tensor(), eps);
#endif
  return rms_norm_aten(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> keep_rms_norm_16(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (rms_norm_applies(x, weight)) {
    return detail::keep_norm(x, weight, at::Tensor(), eps, nullptr);
  }
#endif
  return {x, rms_norm_aten(x, weight, eps)};
}

bool add_rms_norm_applies(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight) {
  return rms_norm_applies(x, weight) && delta.sizes() == x.sizes() &&
         delta.scalar_type() == autocast_16(x);
}

std::pair<at::Tensor, at::Tensor> add_rms_norm_16(const at::Tensor& x, const at::Tensor& delta,
                                                  const at::Tensor& weight, double eps) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (add_rms_norm_applies(x, delta, weight)) {
    return detail::add_norm(x, delta, weight, at::Tensor(), eps, nullptr);
  }
#endif
  at::Tensor h = x + delta;
  return {h, rms_norm_aten(h, weight, eps)};
}

std::pair<at::Tensor, at::Tensor> keep_rms_norm_fp8(const at::Tensor& x, const at::Tensor& weight,
                                                    double eps, const NormFp8Target& target) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (rms_norm_applies(x, weight)) {
    return detail::keep_norm(x, weight, at::Tensor(), eps, &target);
  }
#endif
  (void)eps;
  (void)target;
  refuse("keep_rms_norm_fp8", "RMSNorm", x, "rms_norm_applies");
}

std::pair<at::Tensor, at::Tensor> add_rms_norm_fp8(const at::Tensor& x, const at::Tensor& delta,
                                                   const at::Tensor& weight, double eps,
                                                   const NormFp8Target& target) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (add_rms_norm_applies(x, delta, weight)) {
    return detail::add_norm(x, delta, weight, at::Tensor(), eps, &target);
  }
#endif
  (void)eps;
  (void)target;
  refuse("add_rms_norm_fp8", "RMSNorm", x, "add_rms_norm_applies");
}

NormFp8Target take_fp8_target(fabric::nn::Fp8InputCast& cast) {
  cast.taken = true;
  return {cast.history, cast.record, cast.q, cast.inverse, cast.amax};
}

}  // namespace fabric::models
