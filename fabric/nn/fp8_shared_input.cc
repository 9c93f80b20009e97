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

// fp8_linears' layers as one autograd node: their input quantized once (with the first layer's
// history under delayed scaling, whose row every layer then holds), each layer's GEMM with it;
// backward sums the layers' input gradients as autograd sums separate layers' (the engine runs the
// later-made node first: q + (k + v)).
struct Fp8SharedInput : torch::autograd::Function<Fp8SharedInput> {
  // weights, biases (no elements for none), histories, seeded and grad_margins (Fp8Linear's, one
  // per layer); record, fast: every layer's (fp8_linears checks they agree); input: x's cast
  // made already (x a stand-in, never read; the first history pushed by its maker), or x's amax.
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases, at::TensorList histories,
                               at::TensorList seeded, std::vector<int64_t> grad_margins,
                               bool rowwise, bool record, bool fast, const Fp8Input* input) {
    const size_t n = weights.size();
    // An output nothing uses gets no gradient (not zeros): its layer's backward does not run.
    ctx->set_materialize_grads(false);
    const Quantized qx =
        node_input(x, weights[0].size(1), input, rowwise, histories[0], seeded[0], record);
    // What each layer's own cast would have pushed into its history (the same input's amax):
    // the first's row, now advanced.
    if (record && histories[0].numel() > 0)
      for (size_t i = 1; i < n; ++i) share_input_row(histories[0], histories[i], seeded[i]);
    std::vector<torch::Tensor> to_save{qx.qt, qx.cols_inverse};
    variable_list ys;
    std::vector<int64_t> sizes = x.sizes().vec();
    for (size_t i = 0; i < n; ++i) {
      const Fp8Forward f = weight_gemm(qx, weights[i], biases[i], output_dtype(x), rowwise,
                                       histories[i], seeded[i], record, fast);
      to_save.push_back(f.w8t);
      to_save.push_back(f.sw);
      sizes.back() = weights[i].size(0);
      ys.push_back(f.y.view(sizes));
    }
    ctx->save_for_backward(to_save);
    std::vector<int64_t> w_types;
    c10::impl::GenericList b_types(c10::AnyType::get());
    for (size_t i = 0; i < n; ++i) {
      w_types.push_back(static_cast<int64_t>(weights[i].scalar_type()));
      b_types.push_back(dtype_or_none(biases[i]));
    }
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtypes"] = w_types;
    ctx->saved_data["b_dtypes"] = b_types;
    ctx->saved_data["rowwise"] = rowwise;
    ctx->saved_data["fast_backward"] = fast && rowwise;
    ctx->saved_data["histories"] = histories.vec();
    ctx->saved_data["seeded"] = seeded.vec();
    ctx->saved_data["grad_margins"] = grad_margins;
    return ys;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const size_t n = grads.size();
    const auto w_types = ctx->saved_data["w_dtypes"].toIntVector();
    const auto b_types = ctx->saved_data["b_dtypes"].toList();
    const auto histories = ctx->saved_data["histories"].toTensorVector();
    const auto seeded = ctx->saved_data["seeded"].toTensorVector();
    const auto x_dtype = saved_dtype(ctx, "x_dtype");
    const bool rowwise = ctx->saved_data["rowwise"].toBool();
    const bool fast = ctx->saved_data["fast_backward"].toBool();
    const auto margins = ctx->saved_data["grad_margins"].toIntVector();
    variable_list out(4 * n + 6);
    torch::Tensor grad_x;
    std::vector<int64_t> x_sizes;
    for (size_t i = n; i-- > 0;) {
      if (!grads[i].defined()) continue;  // an output nothing used: as its own layer, no pass
      const torch::Tensor& w8t = s[2 + 2 * i];
      const std::optional<c10::ScalarType> b_dtype = optional_dtype(b_types.get(i));
      const Fp8Grads g = backward_gemms(
          grads[i].reshape({-1, w8t.size(1)}).contiguous(), {}, s[0], s[1], w8t, s[3 + 2 * i],
          x_dtype, static_cast<c10::ScalarType>(w_types[i]), b_dtype, rowwise, fast, histories[i],
          seeded[i], margins[i], ctx->needs_input_grad(0), ctx->needs_input_grad(1 + i));
      if (g.x.defined()) grad_x = grad_x.defined() ? g.x + grad_x : g.x;
      if (x_sizes.empty()) {
        x_sizes = grads[i].sizes().vec();
        x_sizes.back() = w8t.size(0);
      }
      out[1 + i] = g.w;
      out[1 + n + i] = g.b;
    }
    if (grad_x.defined()) out[0] = grad_x.view(x_sizes);
    return out;
  }
};

}  // namespace
}  // namespace detail

std::vector<torch::Tensor> fp8_linears(const torch::Tensor& x, const std::vector<Fp8Layer>& layers,
                                       Fp8Scaling scaling, const Fp8Input* input) {
  if (input != nullptr) detail::check_shared_input(*input, x, layers, scaling);
  auto separate = [&] {
    std::vector<torch::Tensor> ys;
    for (const Fp8Layer& l : layers)
      ys.push_back(fp8_linear(x, l.weight, l.bias, scaling, l.history, false, l.fast_accumulation));
    return ys;
  };
  const bool rowwise = scaling == Fp8Scaling::kRowwise;
  if ((rowwise && !x.is_cuda()) || !detail::can_share_input(x, layers, scaling)) return separate();
  std::vector<torch::Tensor> weights, biases, amaxes, seeded;
  std::vector<int64_t> margins;
  for (const Fp8Layer& l : layers) {
    const auto [amax, s] = detail::history_inputs(scaling, l.history, x);
    weights.push_back(l.weight);
    biases.push_back(detail::or_empty(l.bias, l.weight));
    amaxes.push_back(amax);
    seeded.push_back(s);
    margins.push_back(detail::grad_margin(l.history));
  }
  const bool record = detail::records(scaling, x, layers[0].weight);
  const bool fast = layers[0].fast_accumulation;
  return detail::Fp8SharedInput::apply(x, at::TensorList(weights), at::TensorList(biases),
                                       at::TensorList(amaxes), at::TensorList(seeded), margins,
                                       rowwise, record, fast, input);
}

}  // namespace fabric::nn
