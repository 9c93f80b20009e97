#include "fabric/nn/fp8.h"

#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8_gemm.h"

namespace fabric::nn {

namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Fp8Linear : torch::autograd::Function<Fp8Linear> {
  // bias: a tensor with no elements for none (an undefined tensor cannot be an input).
  // history, seeded: Fp8History's tensors under delayed scaling (no elements otherwise); record:
  // this forward records a graph (its backward will run); gelu: the layer's input is
  // gelu_tanh(x) (x the pre-activation; the CUDA kernels apply it as they read x); fast:
  // fp8_linear's fast_accumulation; grad_margin: Fp8History's (delayed); input: x's cast made
  // already (x a stand-in, never read), or (tensorwise) x's amax.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool rowwise,
                               const torch::Tensor& history, const torch::Tensor& seeded,
                               bool record, bool gelu, bool fast, int64_t grad_margin,
                               const Fp8Input* input) {
    const int64_t k = weight.size(1), n = weight.size(0);
    // (A made cast with bytes: x is a stand-in; an amax alone: x is read, its amax given.)
    const bool made = input != nullptr && input->q.defined();
    const torch::Tensor x2 = made ? torch::Tensor() : x.reshape({-1, k}).contiguous();
    const Fp8Forward f =
        made ? weight_gemm(made_input(*input), weight, bias, output_dtype(x), rowwise, history,
                           seeded, record, fast)
             : forward_gemm(x2, weight, bias, output_dtype(x), rowwise, history, seeded, record,
                            {gelu ? Pointwise::Op::kGeluTanh : Pointwise::Op::kNone}, fast,
                            input != nullptr ? input->amax : torch::Tensor());
    // (and the pre-activation, for GELU's backward)
    ctx->save_for_backward({f.x8t, f.sx, f.w8t, f.sw, gelu ? x2 : torch::Tensor()});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = dtype_or_none(bias);
    ctx->saved_data["rowwise"] = rowwise;
    ctx->saved_data["fast_backward"] = fast && rowwise;  // as torchao: rowwise's backward too
    ctx->saved_data["history"] = history;
    ctx->saved_data["seeded"] = seeded;
    ctx->saved_data["grad_margin"] = grad_margin;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = n;
    return f.y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t k = saved[2].size(0), n = saved[2].size(1);
    std::vector<int64_t> x_sizes = grads[0].sizes().vec();
    x_sizes.back() = k;
    const Fp8Grads g = backward_gemms(
        grads[0].reshape({-1, n}).contiguous(), {}, saved[0], saved[1], saved[2], saved[3],
        saved_dtype(ctx, "x_dtype"), saved_dtype(ctx, "w_dtype"), bias_dtype(ctx, "b_dtype"),
        ctx->saved_data["rowwise"].toBool(), ctx->saved_data["fast_backward"].toBool(),
        ctx->saved_data["history"].toTensor(), ctx->saved_data["seeded"].toTensor(),
        ctx->saved_data["grad_margin"].toInt(), ctx->needs_input_grad(0), ctx->needs_input_grad(1));
    // Through the GELU the forward applied (to the pre-activation it saved).
    torch::Tensor grad_x = g.x;
    if (saved[4].defined() && grad_x.defined())
      grad_x = torch::gelu_backward(grad_x, saved[4], "tanh");
    variable_list out(11);
    if (grad_x.defined()) out[0] = grad_x.view(x_sizes);
    out[1] = g.w;
    out[2] = g.b;
    return out;
  }
};

}  // namespace
}  // namespace detail

Fp8History::Fp8History(int64_t length, int64_t grad_margin)
    : length(length), grad_margin(grad_margin), seeded(torch::zeros({3}, torch::kBool)) {
  if (length < 1)
    throw Error("fabric.fp8.amax_history: " + std::to_string(length) +
                " steps; delayed scaling keeps at least 1");
  if (grad_margin < 0 || grad_margin > 15)
    throw Error(
        "fabric.fp8.grad_margin: " + std::to_string(grad_margin) +
        "; set a power of two from 0 to 15 (the default 3 leaves the gradient 8x headroom)");
}

torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, Fp8Scaling scaling, Fp8History* history,
                         bool gelu_tanh_input, bool fast_accumulation, const Fp8Input* input) {
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (input != nullptr) detail::check_input(*input, x, weight, scaling, gelu_tanh_input);
  if (!detail::fits(m, weight.size(1), weight.size(0)))
    return torch::linear(gelu_tanh_input ? torch::gelu(x, "tanh") : x, weight, bias);
  const bool rowwise = scaling == Fp8Scaling::kRowwise;
  if (rowwise && !x.is_cuda())
    throw Error(
        "fabric.fp8.recipe: rowwise: float8 GEMMs with a scale per row run on CUDA only ("
        "LibTorch's CPU _scaled_mm takes one scale per tensor); use tensorwise on " +
        x.device().str());
  const auto [amax, seeded] = detail::history_inputs(scaling, history, x);
  return detail::Fp8Linear::apply(x, weight, detail::or_empty(bias, weight), rowwise, amax, seeded,
                                  detail::records(scaling, x, weight), gelu_tanh_input,
                                  fast_accumulation, detail::grad_margin(history), input);
}

}  // namespace fabric::nn
