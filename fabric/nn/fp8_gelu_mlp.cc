#include "fabric/nn/fp8.h"

#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "fabric/nn/fp8_gemm.h"

namespace fabric::nn {

namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// fp8_gelu_mlp's two layers as one autograd node (tensorwise or delayed), so that the first
// layer's output gradient is quantized from the second's input gradient and the saved
// pre-activation in one pass (through the GELU), never written in 16 bits.
struct Fp8GeluMlp : torch::autograd::Function<Fp8GeluMlp> {
  // Biases, histories, seeded and margins as Fp8Linear's; record1, record2: each layer's pass
  // trains.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& w1, const torch::Tensor& b1,
                               const torch::Tensor& w2, const torch::Tensor& b2,
                               const torch::Tensor& history1, const torch::Tensor& seeded1,
                               const torch::Tensor& history2, const torch::Tensor& seeded2,
                               bool record1, bool record2, bool fast1, bool fast2,
                               int64_t grad_margin1, int64_t grad_margin2, const Fp8Input* input) {
    // (With input's bytes, x is a stand-in: its cast was made by its producer.)
    const Fp8Forward f1 =
        weight_gemm(node_input(x, w1.size(1), input, false, history1, seeded1, record1), w1, b1,
                    output_dtype(x), false, history1, seeded1, record1, fast1);
    const torch::Tensor& pre = f1.y;  // [M, hidden]
    const Fp8Forward f2 = forward_gemm(pre, w2, b2, output_dtype(pre), false, history2, seeded2,
                                       record2, {Pointwise::Op::kGeluTanh}, fast2);
    ctx->save_for_backward({f1.x8t, f1.sx, f1.w8t, f1.sw, f2.x8t, f2.sx, f2.w8t, f2.sw, pre});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w1_dtype"] = static_cast<int64_t>(w1.scalar_type());
    ctx->saved_data["w2_dtype"] = static_cast<int64_t>(w2.scalar_type());
    ctx->saved_data["b1_dtype"] = dtype_or_none(b1);
    ctx->saved_data["b2_dtype"] = dtype_or_none(b2);
    ctx->saved_data["history1"] = history1;
    ctx->saved_data["seeded1"] = seeded1;
    ctx->saved_data["history2"] = history2;
    ctx->saved_data["seeded2"] = seeded2;
    ctx->saved_data["grad_margin1"] = grad_margin1;
    ctx->saved_data["grad_margin2"] = grad_margin2;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = w2.size(0);
    return f2.y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const torch::Tensor& pre = s[8];
    std::vector<int64_t> x_sizes = grads[0].sizes().vec();
    x_sizes.back() = s[0].size(0);
    const bool before =
        ctx->needs_input_grad(0) || ctx->needs_input_grad(1) || ctx->needs_input_grad(2);
    // The second layer: the gradient of the GELU's output, [M, hidden] (when c_fc's node needs it).
    const Fp8Grads g2 = backward_gemms(
        grads[0].reshape({-1, s[6].size(1)}).contiguous(), {}, s[4], s[5], s[6], s[7],
        pre.scalar_type(), saved_dtype(ctx, "w2_dtype"), bias_dtype(ctx, "b2_dtype"), false, false,
        ctx->saved_data["history2"].toTensor(), ctx->saved_data["seeded2"].toTensor(),
        ctx->saved_data["grad_margin2"].toInt(), before, ctx->needs_input_grad(3));
    variable_list out(16);
    out[3] = g2.w;
    out[4] = g2.b;
    // Nothing before the first layer trains (c_fc frozen, x without a gradient): as the two
    // layers, whose first would have no node, nothing runs for it (and its history stays).
    if (!before) return out;
    // The first: its output gradient through the GELU, taken in its own cast.
    const Fp8Grads g1 = backward_gemms(
        g2.x, {Pointwise::Op::kGeluTanhGrad, pre}, s[0], s[1], s[2], s[3],
        saved_dtype(ctx, "x_dtype"), saved_dtype(ctx, "w1_dtype"), bias_dtype(ctx, "b1_dtype"),
        false, false, ctx->saved_data["history1"].toTensor(), ctx->saved_data["seeded1"].toTensor(),
        ctx->saved_data["grad_margin1"].toInt(), ctx->needs_input_grad(0),
        ctx->needs_input_grad(1));
    if (g1.x.defined()) out[0] = g1.x.view(x_sizes);
    out[1] = g1.w;
    out[2] = g1.b;
    return out;
  }
};

}  // namespace
}  // namespace detail

torch::Tensor fp8_gelu_mlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                           const torch::Tensor& w2, const torch::Tensor& b2, Fp8Scaling scaling,
                           Fp8History* history1, Fp8History* history2, bool fast1, bool fast2,
                           const Fp8Input* input) {
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (scaling == Fp8Scaling::kRowwise || !detail::fits(m, w1.size(1), w1.size(0)) ||
      !detail::fits(m, w2.size(1), w2.size(0)))
    return fp8_linear(fp8_linear(x, w1, b1, scaling, history1, false, fast1, input), w2, b2,
                      scaling, history2, /*gelu_tanh_input=*/true, fast2);
  if (input != nullptr) detail::check_input(*input, x, w1, scaling, false);
  const auto [amax1, seeded1] = detail::history_inputs(scaling, history1, x);
  const auto [amax2, seeded2] = detail::history_inputs(scaling, history2, x);
  const bool record1 = detail::records(scaling, x, w1);
  // The second layer's input (the first's output) needs a gradient when anything before it does.
  const bool record2 = record1 || detail::records(scaling, detail::or_empty(b1, w1), w2);
  return detail::Fp8GeluMlp::apply(x, w1, detail::or_empty(b1, w1), w2, detail::or_empty(b2, w2),
                                   amax1, seeded1, amax2, seeded2, record1, record2, fast1, fast2,
                                   detail::grad_margin(history1), detail::grad_margin(history2),
                                   input);
}

}  // namespace fabric::nn
