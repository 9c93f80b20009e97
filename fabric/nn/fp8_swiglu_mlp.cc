#include "fabric/nn/fp8.h"

#include <ATen/ops/silu.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include "fabric/nn/fp8_gemm.h"

namespace fabric::nn {

namespace detail {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// fp8_swiglu_mlp's three layers as one autograd node (tensorwise or delayed): gate's and up's
// input quantized once (as Fp8SharedInput, with gate's history), down's input quantized from
// gate's and up's outputs through the SwiGLU, and in backward gate's and up's output gradients
// quantized from down's input gradient and the saved gate and up outputs, through the SwiGLU's
// backward: on CUDA, in the casts' own reads (silu(g) · u and its two gradients never written
// in 16 bits).
struct Fp8SwigluMlp : torch::autograd::Function<Fp8SwigluMlp> {
  // w*, b* (no elements for none), h* and s* (history and seeded), margins: gate's, up's and
  // down's, Fp8Linear's. record_gu, fast_gu: gate's and up's (fp8_swiglu_mlp checks they
  // agree); record_d, fast_d: down's; input: x's cast made already (x a stand-in, never read;
  // gate's history pushed by its maker), or x's amax.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& wg, const torch::Tensor& bg,
                               const torch::Tensor& wu, const torch::Tensor& bu,
                               const torch::Tensor& wd, const torch::Tensor& bd,
                               const torch::Tensor& hg, const torch::Tensor& sg,
                               const torch::Tensor& hu, const torch::Tensor& su,
                               const torch::Tensor& hd, const torch::Tensor& sd, bool record_gu,
                               bool record_d, bool fast_gu, bool fast_d,
                               std::vector<int64_t> margins, const Fp8Input* input) {
    const Quantized qx = node_input(x, wg.size(1), input, false, hg, sg, record_gu);
    if (record_gu && hg.numel() > 0) share_input_row(hg, hu, su);
    const c10::ScalarType out = output_dtype(x);
    const Fp8Forward fg = weight_gemm(qx, wg, bg, out, false, hg, sg, record_gu, fast_gu);
    const Fp8Forward fu = weight_gemm(qx, wu, bu, out, false, hu, su, record_gu, fast_gu);
    const torch::Tensor& g = fg.y;  // [M, hidden]
    const torch::Tensor& u = fu.y;
    const Fp8Forward fd = forward_gemm(g, wd, bd, output_dtype(g), false, hd, sd, record_d,
                                       {Pointwise::Op::kSwiglu, u}, fast_d);
    ctx->save_for_backward(
        {fg.x8t, fg.sx, fg.w8t, fg.sw, fu.w8t, fu.sw, fd.x8t, fd.sx, fd.w8t, fd.sw, g, u});
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtypes"] = std::vector<int64_t>{static_cast<int64_t>(wg.scalar_type()),
                                                       static_cast<int64_t>(wu.scalar_type()),
                                                       static_cast<int64_t>(wd.scalar_type())};
    c10::impl::GenericList b_types(c10::AnyType::get());
    for (const torch::Tensor* b : {&bg, &bu, &bd}) b_types.push_back(dtype_or_none(*b));
    ctx->saved_data["b_dtypes"] = b_types;
    ctx->saved_data["histories"] = std::vector<torch::Tensor>{hg, hu, hd};
    ctx->saved_data["seeded"] = std::vector<torch::Tensor>{sg, su, sd};
    ctx->saved_data["margins"] = margins;
    std::vector<int64_t> sizes = x.sizes().vec();
    sizes.back() = wd.size(0);
    return fd.y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const torch::Tensor &g = s[10], &u = s[11];
    const auto w_types = ctx->saved_data["w_dtypes"].toIntVector();
    const auto b_types = ctx->saved_data["b_dtypes"].toList();
    const auto histories = ctx->saved_data["histories"].toTensorVector();
    const auto seeded = ctx->saved_data["seeded"].toTensorVector();
    const auto margins = ctx->saved_data["margins"].toIntVector();
    const auto x_dtype = saved_dtype(ctx, "x_dtype");
    // Layer i's gradients (0 gate, 1 up, 2 down: its weight's w8t and sw at s[kWeight[i]] and
    // after) from g2 and its input's x8t at s[input], sx after.
    constexpr int kWeight[3] = {2, 4, 8};
    // (need_x: whether the layer's input gradient is wanted; its weight's is when the node's
    // input 1, 3 or 5 (gate's, up's, down's weight) needs one.)
    auto layer_grads = [&](int i, const torch::Tensor& g2, const Pointwise& through, int input,
                           c10::ScalarType in_dtype, bool need_x, const torch::Tensor& amax = {}) {
      return backward_gemms(g2, through, s[input], s[input + 1], s[kWeight[i]], s[kWeight[i] + 1],
                            in_dtype, static_cast<c10::ScalarType>(w_types[i]),
                            optional_dtype(b_types.get(i)), false, false, histories[i], seeded[i],
                            margins[i], need_x, ctx->needs_input_grad(1 + 2 * i), amax);
    };
    variable_list out(19);
    // Nothing before down trains (gate and up frozen, x without a gradient): as the separate
    // layers, whose node would not exist, nothing runs for them (and their histories stay).
    bool before = false;
    for (size_t i = 0; i < 5; ++i) before = before || ctx->needs_input_grad(i);
    // down: the gradient of the SwiGLU's output, [M, hidden] (wanted when anything before is).
    const Fp8Grads gd = layer_grads(2, grads[0].reshape({-1, s[8].size(1)}).contiguous(), {}, 6,
                                    g.scalar_type(), before);
    out[5] = gd.w;
    out[6] = gd.b;
    if (!before) return out;
    // up, then gate (as autograd runs a node of two outputs: the last first), each output
    // gradient through the SwiGLU taken in its own cast; under dynamic tensorwise scaling both
    // amaxes from one pass over dh, g and u first (on CUDA; else each cast takes its own).
    torch::Tensor amax_gate, amax_up;
    if (histories[0].numel() == 0) std::tie(amax_gate, amax_up) = swiglu_grad_amaxes(gd.x, g, u);
    const bool need_x = ctx->needs_input_grad(0);
    const Fp8Grads gu =
        layer_grads(1, gd.x, {Pointwise::Op::kSwigluUpGrad, g}, 0, x_dtype, need_x, amax_up);
    const Fp8Grads gg =
        layer_grads(0, gd.x, {Pointwise::Op::kSwigluGateGrad, g, u}, 0, x_dtype, need_x, amax_gate);
    std::vector<int64_t> x_sizes = grads[0].sizes().vec();
    x_sizes.back() = s[0].size(0);
    if (need_x) out[0] = (gg.x + gu.x).view(x_sizes);
    out[1] = gg.w;
    out[2] = gg.b;
    out[3] = gu.w;
    out[4] = gu.b;
    return out;
  }
};

}  // namespace
}  // namespace detail

torch::Tensor fp8_swiglu_mlp(const torch::Tensor& x, const Fp8Layer& gate, const Fp8Layer& up,
                             const Fp8Layer& down, Fp8Scaling scaling, SwigluFn swiglu,
                             const Fp8Input* input) {
  if (input != nullptr) detail::check_shared_input(*input, x, {gate, up}, scaling);
  auto separate = [&] {
    const std::vector<torch::Tensor> gu = fp8_linears(x, {gate, up}, scaling, input);
    const torch::Tensor h = swiglu != nullptr ? swiglu(gu[0], gu[1]) : at::silu(gu[0]) * gu[1];
    return fp8_linear(h, down.weight, down.bias, scaling, down.history, false,
                      down.fast_accumulation);
  };
  const torch::Tensor &wg = gate.weight, &wu = up.weight, &wd = down.weight;
  if (scaling == Fp8Scaling::kRowwise || !detail::can_share_input(x, {gate, up}, scaling) ||
      wd.dim() != 2)
    return separate();
  const int64_t hidden = wg.size(0), m = x.numel() / x.size(-1);
  if (wu.size(0) != hidden || wd.size(1) != hidden || !detail::fits(m, hidden, wd.size(0)))
    return separate();
  const bool record_gu = detail::records(scaling, x, wg);
  const auto [hg, sg] = detail::history_inputs(scaling, gate.history, x);
  const auto [hu, su] = detail::history_inputs(scaling, up.history, x);
  const auto [hd, sd] = detail::history_inputs(scaling, down.history, x);
  const torch::Tensor bg = detail::or_empty(gate.bias, wg), bu = detail::or_empty(up.bias, wu),
                      bd = detail::or_empty(down.bias, wd);
  // down's input (the SwiGLU of gate's and up's outputs) needs a gradient when anything before
  // it does.
  const bool grad = torch::GradMode::is_enabled();
  const bool h_grad = grad && (x.requires_grad() || wg.requires_grad() || bg.requires_grad() ||
                               wu.requires_grad() || bu.requires_grad());
  const bool record_d = scaling == Fp8Scaling::kDelayed && grad && (h_grad || wd.requires_grad());
  return detail::Fp8SwigluMlp::apply(
      x, wg, bg, wu, bu, wd, bd, hg, sg, hu, su, hd, sd, record_gu, record_d,
      gate.fast_accumulation, down.fast_accumulation,
      std::vector<int64_t>{detail::grad_margin(gate.history), detail::grad_margin(up.history),
                           detail::grad_margin(down.history)},
      input);
}

}  // namespace fabric::nn
