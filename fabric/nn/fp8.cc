#include "fabric/nn/fp8.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_scaled_mm.h>
#include <torch/autograd.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>

#include "fabric/accelerators/device_info.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kE4m3Max = 448.0;
constexpr double kE5m2Max = 57344.0;

// `t` as float8 of `dtype` scaled so that its largest magnitude is the format's largest, and the
// scale that undoes it (float32 scalar): t ≈ q · inverse.
struct Quantized {
  torch::Tensor q, inverse;
};
Quantized quantize(const torch::Tensor& t, c10::ScalarType dtype, double largest) {
  const torch::Tensor amax = t.abs().amax().to(torch::kFloat).clamp_min(1e-12);
  const torch::Tensor scale = largest / amax;
  const torch::Tensor q =
      (t.to(torch::kFloat) * scale).clamp(-largest, largest).to(dtype);  // saturate, no inf
  return {q, scale.reciprocal()};
}

// a [M, K] row-major, b [K, N] column-major (b = w8.t() of a row-major w8 [N, K]).
torch::Tensor scaled_mm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& sa,
                        const torch::Tensor& sb, c10::ScalarType out) {
  return at::_scaled_mm(a, b, sa, sb, /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, out);
}

bool fits(int64_t m, int64_t k, int64_t n) { return m % 16 == 0 && k % 16 == 0 && n % 16 == 0; }

c10::ScalarType output_dtype(const torch::Tensor& x) {
  const c10::DeviceType type = x.device().type();
  if (at::autocast::is_autocast_enabled(type)) return at::autocast::get_autocast_dtype(type);
  return x.scalar_type();
}

struct Fp8Linear : torch::autograd::Function<Fp8Linear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight) {
    const int64_t k = weight.size(1), n = weight.size(0);
    const torch::Tensor x2 = x.reshape({-1, k}).contiguous();
    const c10::ScalarType out = output_dtype(x);
    const Quantized qx = quantize(x2, torch::kFloat8_e4m3fn, kE4m3Max);
    const Quantized qw = quantize(weight, torch::kFloat8_e4m3fn, kE4m3Max);
    const torch::Tensor y = scaled_mm(qx.q, qw.q.t(), qx.inverse, qw.inverse, out);
    ctx->save_for_backward({qx.q, qx.inverse, qw.q, qw.inverse});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x8 = saved[0], &sx = saved[1], &w8 = saved[2], &sw = saved[3];
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const int64_t n = w8.size(0), k = w8.size(1);
    std::vector<int64_t> x_sizes = grads[0].sizes().vec();
    x_sizes.back() = k;
    const torch::Tensor g2 = grads[0].reshape({-1, n}).contiguous();
    const Quantized qg = quantize(g2, torch::kFloat8_e5m2, kE5m2Max);
    // grad_x [M, K] = g [M, N] · w [N, K]: w as a column-major [N, K].
    const torch::Tensor grad_x =
        scaled_mm(qg.q, w8.t().contiguous().t(), qg.inverse, sw, x_dtype).view(x_sizes);
    // grad_w [N, K] = gᵀ [N, M] · x [M, K]: gᵀ row-major, x column-major.
    const torch::Tensor grad_w =
        scaled_mm(qg.q.t().contiguous(), x8.t().contiguous().t(), qg.inverse, sx, torch::kFloat)
            .to(w_dtype);
    return {grad_x, grad_w};
  }
};

}  // namespace

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias) {
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (!fits(m, weight.size(1), weight.size(0))) return torch::linear(x, weight, bias);
  // The bias outside the function (autograd gives its gradient; an undefined tensor cannot be
  // an input of a custom function), in the product's dtype as ATen's linear adds it.
  const torch::Tensor y = Fp8Linear::apply(x, weight);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

bool fp8_supported(const torch::Device& device, std::string* why_not) {
  if (device.is_cpu()) return true;
  if (!device.is_cuda()) {
    if (why_not) *why_not = "float8 GEMMs run on CUDA and CPU devices, not " + device.str();
    return false;
  }
  for (const auto& d : query_runtime_info().devices) {
    if (d.index != device.index()) continue;
    if (d.capability_major * 10 + d.capability_minor >= 89) return true;
    if (why_not)
      *why_not = "cuda:" + std::to_string(d.index) + " has compute capability " +
                 std::to_string(d.capability_major) + "." + std::to_string(d.capability_minor) +
                 " < 8.9 (float8 needs Ada, Hopper or newer)";
    return false;
  }
  if (why_not) *why_not = "no CUDA device " + device.str();
  return false;
}

Fp8Conversion convert_to_fp8(torch::nn::Module& module, const std::vector<std::string>& exclude) {
  Fp8Conversion out;
  // The module itself by reference (named_modules can include it only when a shared_ptr owns it).
  std::vector<std::pair<std::string, torch::nn::Module*>> all = {{"(root)", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    all.emplace_back(item.key(), item.value().get());
  for (const auto& [name, m] : all) {
    if (m->as<torch::nn::LinearImpl>() != nullptr) {
      out.plain.push_back(name);
      continue;
    }
    auto* l = m->as<LinearImpl>();
    if (l == nullptr) continue;
    bool skip = false;
    for (const std::string& pattern : exclude) skip = skip || plan_pattern_matches(pattern, name);
    if (skip) {
      out.excluded.push_back(name);
    } else if (l->weight.size(0) % 16 != 0 || l->weight.size(1) % 16 != 0) {
      out.unfit.push_back(name);
    } else {
      l->set_fp8(true);
      out.converted.push_back(name);
    }
  }
  return out;
}

}  // namespace fabric::nn
