#include "fabric/nn/frozen_weight.h"

#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

namespace fabric::nn {

namespace {

bool is_float8(const torch::Tensor& t) {
  return t.scalar_type() == torch::kFloat8_e4m3fn || t.scalar_type() == torch::kFloat8_e5m2;
}

torch::ScalarType compute_dtype(const torch::Tensor& x) {
  const c10::DeviceType type = x.device().type();
  if (at::autocast::is_autocast_enabled(type)) return at::autocast::get_autocast_dtype(type);
  return x.scalar_type();
}

// Saves the stored weight and its scale, not the dequantized weight: the copy in the compute
// dtype lives only while one GEMM runs (QLoRA's trade: a second dequantization in backward).
// The scale is an empty tensor for none (an autograd function's inputs must be defined).
struct FrozenMatmul : torch::autograd::Function<FrozenMatmul> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& scale) {
    const torch::ScalarType dtype = compute_dtype(x);
    ctx->save_for_backward({weight, scale});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    const torch::Tensor s = scale.numel() > 0 ? scale : torch::Tensor();
    return torch::linear(x.to(dtype), dequantize_weight(weight, s, dtype));
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& g = grads[0];
    const torch::Tensor s = saved[1].numel() > 0 ? saved[1] : torch::Tensor();
    const torch::Tensor w = dequantize_weight(saved[0], s, g.scalar_type());
    const auto x_dtype = static_cast<torch::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    return {torch::matmul(g, w).to(x_dtype), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

bool is_stored_weight(const torch::Tensor& weight, const torch::Tensor& scale,
                      const torch::Tensor& x) {
  if (scale.defined() && is_float8(weight)) return true;
  if (weight.requires_grad() || weight.scalar_type() == x.scalar_type()) return false;
  return !at::autocast::is_autocast_enabled(x.device().type());
}

torch::Tensor dequantize_weight(const torch::Tensor& weight, const torch::Tensor& scale,
                                torch::ScalarType dtype) {
  if (!is_float8(weight) || !scale.defined()) return weight.to(dtype);
  return (weight.to(torch::kFloat) * scale.to(torch::kFloat).unsqueeze(1)).to(dtype);
}

torch::Tensor frozen_linear(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& scale, const torch::Tensor& bias) {
  const torch::Tensor y = FrozenMatmul::apply(
      x, weight, scale.defined() ? scale : torch::empty({0}, x.options().dtype(torch::kFloat)));
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;  // y's dtype, as linear's
}

std::pair<torch::Tensor, torch::Tensor> quantize_rows_fp8(const torch::Tensor& weight,
                                                          const torch::Tensor& amax) {
  torch::NoGradGuard no_grad;
  const torch::Tensor a = amax.to(weight.device(), torch::kFloat);
  const torch::Tensor scale = torch::where(a > 0, a / kFloat8E4m3Max, torch::ones_like(a));
  const torch::Tensor q = (weight.to(torch::kFloat) / scale.unsqueeze(1))
                              .clamp(-kFloat8E4m3Max, kFloat8E4m3Max)
                              .to(torch::kFloat8_e4m3fn);
  return {q, scale};
}

}  // namespace fabric::nn
