#include "fabric/nn/fp8.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_scaled_mm.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8_quantize.h"

namespace fabric::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using detail::delayed_operand;
using detail::kE4m3Max;
using detail::kE5m2Max;
using detail::kernel_path;
using detail::quantize;
using detail::Quantized;

// _scaled_mm's scale of an operand: the scalar, or (rowwise) its lines as [M, 1] for the first
// operand and [1, N] for the second.
torch::Tensor scale_a(const torch::Tensor& inverse) {
  return inverse.dim() == 0 ? inverse : inverse.view({-1, 1});
}
torch::Tensor scale_b(const torch::Tensor& inverse) {
  return inverse.dim() == 0 ? inverse : inverse.view({1, -1});
}

// a [M, K] row-major, b [K, N] column-major (b = w8.t() of a row-major w8 [N, K]).
torch::Tensor scaled_mm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& sa,
                        const torch::Tensor& sb, c10::ScalarType out, bool fast,
                        const std::optional<torch::Tensor>& bias = std::nullopt) {
  return at::_scaled_mm(a, b, sa, sb, bias, /*scale_result=*/std::nullopt, out, fast);
}

// (An empty batch runs as ATen's linear: the cast kernels launch nothing for it, so its scales
// would be left unwritten.)
bool fits(int64_t m, int64_t k, int64_t n) {
  return m > 0 && m % 16 == 0 && k % 16 == 0 && n % 16 == 0;
}

c10::ScalarType output_dtype(const torch::Tensor& x) {
  const c10::DeviceType type = x.device().type();
  if (at::autocast::is_autocast_enabled(type)) return at::autocast::get_autocast_dtype(type);
  return x.scalar_type();
}

// One Linear's forward in float8 (Fp8Linear's, and each layer of Fp8GeluMlp's): y [M, N] =
// x2 [M, K] · weightᵀ + bias (bias: no elements for none) in `out`, and the transposed operands
// with their scales that its backward reads. history, seeded: Fp8History's tensors under delayed
// scaling (no elements otherwise); record: the pass trains; gelu: the input is gelu_tanh(x2) (the
// CUDA kernels apply it as they read x2); fast: fp8_linear's fast_accumulation.
struct Fp8Forward {
  torch::Tensor y, x8t, sx, w8t, sw;
};

// forward_gemm's first operand: x2 (gelu: gelu_tanh(x2)) in e4m3, with history's row 0.
Quantized quantize_input(const torch::Tensor& x2, bool rowwise, const torch::Tensor& history,
                         const torch::Tensor& seeded, bool record, bool gelu) {
  const auto dx = delayed_operand(history, seeded, 0, record);
  const bool gelu_in_cast = gelu && !rowwise && kernel_path(x2);
  const torch::Tensor input = gelu && !gelu_in_cast ? torch::gelu(x2, "tanh") : x2;
  return quantize(input, torch::kFloat8_e4m3fn, kE4m3Max, rowwise, dx ? &*dx : nullptr, nullptr,
                  gelu_in_cast);
}

// forward_gemm with its input quantized already (qx: quantize_input's; Fp8SharedInput's layers).
Fp8Forward weight_gemm(const Quantized& qx, const torch::Tensor& weight, const torch::Tensor& bias,
                       c10::ScalarType out, bool rowwise, const torch::Tensor& history,
                       const torch::Tensor& seeded, bool record, bool fast) {
  const auto dw = delayed_operand(history, seeded, 1, record);
  const Quantized qw =
      quantize(weight, torch::kFloat8_e4m3fn, kE4m3Max, rowwise, dw ? &*dw : nullptr);
  // A 16-bit product takes the bias in the GEMM's epilogue (as ATen's linear does); a float32
  // one (no autocast) adds it after (_scaled_mm takes a bias only for 16-bit outputs on CUDA).
  // Rowwise GEMMs write bf16 and add the bias after.
  const bool has_bias = bias.numel() > 0;
  const bool in_gemm = !rowwise && (out == torch::kBFloat16 || out == torch::kHalf);
  torch::Tensor y =
      scaled_mm(qx.q, qw.q.t(), scale_a(qx.rows_inverse), scale_b(qw.rows_inverse),
                rowwise ? torch::kBFloat16 : out, fast,
                has_bias && in_gemm ? std::optional<torch::Tensor>(bias.to(out)) : std::nullopt);
  if (y.scalar_type() != out) y = y.to(out);
  if (has_bias && !in_gemm) y = y + bias.to(out);
  // Backward reads both operands transposed (column-major for _scaled_mm): keep those.
  return {y, qx.qt, qx.cols_inverse, qw.qt, qw.cols_inverse};
}

Fp8Forward forward_gemm(const torch::Tensor& x2, const torch::Tensor& weight,
                        const torch::Tensor& bias, c10::ScalarType out, bool rowwise,
                        const torch::Tensor& history, const torch::Tensor& seeded, bool record,
                        bool gelu, bool fast) {
  const Quantized qx = quantize_input(x2, rowwise, history, seeded, record, gelu);
  return weight_gemm(qx, weight, bias, out, rowwise, history, seeded, record, fast);
}

// The three gradients of one float8 Linear from its output gradient g2 [M, N] and forward_gemm's
// x8t [K, M], sx, w8t [K, N], sw (rowwise: each row k with sx[k] / sw[k]). gelu_pre (may be
// undefined): g2 is the gradient of gelu_tanh's output and gelu_pre [M, N] its pre-activation,
// this layer's output: the gradient through the GELU is what is quantized (computed by the
// CUDA cast as it reads both; fp8_quantize.h). grad_b is undefined without a bias.
struct Fp8Grads {
  torch::Tensor x, w, b;
};

Fp8Grads backward_gemms(const torch::Tensor& g2, const torch::Tensor& gelu_pre,
                        const torch::Tensor& x8t, const torch::Tensor& sx, const torch::Tensor& w8t,
                        const torch::Tensor& sw, c10::ScalarType x_dtype, c10::ScalarType w_dtype,
                        std::optional<c10::ScalarType> b_dtype, bool rowwise, bool fast,
                        const torch::Tensor& history, const torch::Tensor& seeded,
                        int64_t grad_margin) {
  // Rowwise quantizes the gradient to e4m3 as well (as torchao's rowwise recipe does: a scale
  // per row covers the range e5m2's exponent bits are for, and the rowwise GEMM takes e4m3).
  const auto dg =
      delayed_operand(history, seeded, 2, /*record=*/true, static_cast<int>(grad_margin));
  // The bias's gradient (the rows' sum, in float32) from the gradient's cast when its kernel
  // takes it (or, through the GELU, from quantize's own gradient), else below.
  torch::Tensor bias_sum;
  torch::Tensor* sum = b_dtype ? &bias_sum : nullptr;
  const Quantized qg =
      rowwise ? quantize(g2, torch::kFloat8_e4m3fn, kE4m3Max, true, nullptr, sum, false, gelu_pre)
              : quantize(g2, torch::kFloat8_e5m2, kE5m2Max, false, dg ? &*dg : nullptr, sum, false,
                         gelu_pre);
  Fp8Grads out;
  // grad_x [M, K] = g [M, N] · w [N, K]: w as a column-major [N, K].
  out.x = scaled_mm(qg.q, w8t.t(), scale_a(qg.rows_inverse), scale_b(sw),
                    rowwise ? torch::kBFloat16 : x_dtype, fast)
              .to(x_dtype);
  // grad_w [N, K] = gᵀ [N, M] · x [M, K]: gᵀ row-major, x column-major.
  out.w = scaled_mm(qg.qt, x8t.t(), scale_a(qg.cols_inverse), scale_b(sx),
                    rowwise ? torch::kBFloat16 : torch::kFloat, fast)
              .to(w_dtype);
  if (b_dtype) {
    if (!bias_sum.defined()) bias_sum = g2.sum(0, /*keepdim=*/false, torch::kFloat);
    out.b = bias_sum.to(*b_dtype);
  }
  return out;
}

std::optional<c10::ScalarType> bias_dtype(const AutogradContext* ctx, const char* key) {
  const auto& v = ctx->saved_data.at(key);
  if (v.isNone()) return std::nullopt;
  return static_cast<c10::ScalarType>(v.toInt());
}

c10::ScalarType saved_dtype(const AutogradContext* ctx, const char* key) {
  return static_cast<c10::ScalarType>(ctx->saved_data.at(key).toInt());
}

c10::IValue dtype_or_none(const torch::Tensor& bias) {
  return bias.numel() > 0 ? c10::IValue(static_cast<int64_t>(bias.scalar_type())) : c10::IValue();
}

struct Fp8Linear : torch::autograd::Function<Fp8Linear> {
  // bias: a tensor with no elements for none (an undefined tensor cannot be an input).
  // history, seeded: Fp8History's tensors under delayed scaling (no elements otherwise); record:
  // this forward records a graph (its backward will run); gelu: the layer's input is
  // gelu_tanh(x) (x the pre-activation; the CUDA kernels apply it as they read x); fast:
  // fp8_linear's fast_accumulation; grad_margin: Fp8History's (delayed).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, bool rowwise,
                               const torch::Tensor& history, const torch::Tensor& seeded,
                               bool record, bool gelu, bool fast, int64_t grad_margin) {
    const int64_t k = weight.size(1), n = weight.size(0);
    const torch::Tensor x2 = x.reshape({-1, k}).contiguous();
    const Fp8Forward f = forward_gemm(x2, weight, bias, output_dtype(x), rowwise, history, seeded,
                                      record, gelu, fast);
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
        grads[0].reshape({-1, n}).contiguous(), torch::Tensor(), saved[0], saved[1], saved[2],
        saved[3], saved_dtype(ctx, "x_dtype"), saved_dtype(ctx, "w_dtype"),
        bias_dtype(ctx, "b_dtype"), ctx->saved_data["rowwise"].toBool(),
        ctx->saved_data["fast_backward"].toBool(), ctx->saved_data["history"].toTensor(),
        ctx->saved_data["seeded"].toTensor(), ctx->saved_data["grad_margin"].toInt());
    // Through the GELU the forward applied (to the pre-activation it saved).
    torch::Tensor grad_x = g.x;
    if (saved[4].defined()) grad_x = torch::gelu_backward(grad_x, saved[4], "tanh");
    variable_list out(10);
    out[0] = grad_x.view(x_sizes);
    out[1] = g.w;
    out[2] = g.b;
    return out;
  }
};

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
                               int64_t grad_margin1, int64_t grad_margin2) {
    const torch::Tensor x2 = x.reshape({-1, w1.size(1)}).contiguous();
    const Fp8Forward f1 =
        forward_gemm(x2, w1, b1, output_dtype(x), false, history1, seeded1, record1, false, fast1);
    const torch::Tensor& pre = f1.y;  // [M, hidden]
    const Fp8Forward f2 = forward_gemm(pre, w2, b2, output_dtype(pre), false, history2, seeded2,
                                       record2, true, fast2);
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
    // The second layer: the gradient of the GELU's output, [M, hidden].
    const Fp8Grads g2 = backward_gemms(
        grads[0].reshape({-1, s[6].size(1)}).contiguous(), torch::Tensor(), s[4], s[5], s[6], s[7],
        pre.scalar_type(), saved_dtype(ctx, "w2_dtype"), bias_dtype(ctx, "b2_dtype"), false, false,
        ctx->saved_data["history2"].toTensor(), ctx->saved_data["seeded2"].toTensor(),
        ctx->saved_data["grad_margin2"].toInt());
    variable_list out(15);
    out[3] = g2.w;
    out[4] = g2.b;
    // Nothing before the first layer trains (c_fc frozen, x without a gradient): as the two
    // layers, whose first would have no node, nothing runs for it (and its history stays).
    if (!ctx->needs_input_grad(0) && !ctx->needs_input_grad(1) && !ctx->needs_input_grad(2))
      return out;
    // The first: its output gradient through the GELU, taken in its own cast.
    const Fp8Grads g1 = backward_gemms(
        g2.x, pre, s[0], s[1], s[2], s[3], saved_dtype(ctx, "x_dtype"),
        saved_dtype(ctx, "w1_dtype"), bias_dtype(ctx, "b1_dtype"), false, false,
        ctx->saved_data["history1"].toTensor(), ctx->saved_data["seeded1"].toTensor(),
        ctx->saved_data["grad_margin1"].toInt());
    out[0] = g1.x.view(x_sizes);
    out[1] = g1.w;
    out[2] = g1.b;
    return out;
  }
};

// fp8_linears' layers as one autograd node: their input quantized once (with the first layer's
// history under delayed scaling, whose row every layer then holds), each layer's GEMM with it;
// backward sums the layers' input gradients as autograd sums separate layers' (the engine runs the
// later-made node first: q + (k + v)).
struct Fp8SharedInput : torch::autograd::Function<Fp8SharedInput> {
  // weights, biases (no elements for none), histories, seeded and grad_margins (Fp8Linear's, one
  // per layer); record, fast: every layer's (fp8_linears checks they agree).
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& x, at::TensorList weights,
                               at::TensorList biases, at::TensorList histories,
                               at::TensorList seeded, std::vector<int64_t> grad_margins,
                               bool rowwise, bool record, bool fast) {
    const size_t n = weights.size();
    // An output nothing uses gets no gradient (not zeros): its layer's backward does not run.
    ctx->set_materialize_grads(false);
    const torch::Tensor x2 = x.reshape({-1, weights[0].size(1)}).contiguous();
    const Quantized qx = quantize_input(x2, rowwise, histories[0], seeded[0], record, false);
    // What each layer's own cast would have pushed into its history (the same input's amax):
    // the first's row, now advanced.
    if (record && histories[0].numel() > 0) {
      for (size_t i = 1; i < n; ++i) {
        (void)delayed_operand(histories[i], seeded[i], 0, record);  // marks it seeded
        histories[i].select(0, 0).copy_(histories[0].select(0, 0));
      }
    }
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
    std::vector<int64_t> w_types, b_types;  // b_types: -1 for no bias
    for (size_t i = 0; i < n; ++i) {
      w_types.push_back(static_cast<int64_t>(weights[i].scalar_type()));
      b_types.push_back(biases[i].numel() > 0 ? static_cast<int64_t>(biases[i].scalar_type()) : -1);
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
    const auto b_types = ctx->saved_data["b_dtypes"].toIntVector();
    const auto histories = ctx->saved_data["histories"].toTensorVector();
    const auto seeded = ctx->saved_data["seeded"].toTensorVector();
    const auto x_dtype = saved_dtype(ctx, "x_dtype");
    const bool rowwise = ctx->saved_data["rowwise"].toBool();
    const bool fast = ctx->saved_data["fast_backward"].toBool();
    const auto margins = ctx->saved_data["grad_margins"].toIntVector();
    variable_list out(4 * n + 5);
    torch::Tensor grad_x;
    std::vector<int64_t> x_sizes;
    for (size_t i = n; i-- > 0;) {
      if (!grads[i].defined()) continue;  // an output nothing used: as its own layer, no pass
      const torch::Tensor& w8t = s[2 + 2 * i];
      const std::optional<c10::ScalarType> b_dtype =
          b_types[i] < 0 ? std::nullopt
                         : std::optional<c10::ScalarType>(static_cast<c10::ScalarType>(b_types[i]));
      const Fp8Grads g =
          backward_gemms(grads[i].reshape({-1, w8t.size(1)}).contiguous(), torch::Tensor(), s[0],
                         s[1], w8t, s[3 + 2 * i], x_dtype, static_cast<c10::ScalarType>(w_types[i]),
                         b_dtype, rowwise, fast, histories[i], seeded[i], margins[i]);
      grad_x = grad_x.defined() ? g.x + grad_x : g.x;
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

// Fp8History's tensors for fp8_linear / fp8_gelu_mlp: the history (made on x's device at first
// use) and seeded, or no elements when not delayed; throws when delayed has no history.
std::pair<torch::Tensor, torch::Tensor> history_inputs(Fp8Scaling scaling, Fp8History* history,
                                                       const torch::Tensor& x) {
  static const torch::Tensor kNone = torch::empty({0});  // an input, so not undefined
  if (scaling != Fp8Scaling::kDelayed) return {kNone, kNone};
  if (history == nullptr)
    throw Error("fp8_linear: fabric.fp8.recipe: delayed needs the layer's Fp8History");
  if (!history->amax.defined())
    history->amax = torch::zeros({3, history->length + 1}, x.options().dtype(torch::kFloat));
  else if (history->amax.device() != x.device())
    history->amax = history->amax.to(x.device());
  return {history->amax, history->seeded};
}

// Whether a delayed layer's pass with input x and `weight` advances its history (fp8.h).
bool records(Fp8Scaling scaling, const torch::Tensor& x, const torch::Tensor& weight) {
  return scaling == Fp8Scaling::kDelayed && torch::GradMode::is_enabled() &&
         (x.requires_grad() || weight.requires_grad());
}

// The output gradient's margin (delayed scaling's; 0 otherwise, where it is not read).
int64_t grad_margin(const Fp8History* history) { return history ? history->grad_margin : 0; }

torch::Tensor or_empty(const torch::Tensor& bias, const torch::Tensor& weight) {
  return bias.defined() ? bias : torch::empty({0}, weight.options());
}

}  // namespace

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
                         bool gelu_tanh_input, bool fast_accumulation) {
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (!fits(m, weight.size(1), weight.size(0)))
    return torch::linear(gelu_tanh_input ? torch::gelu(x, "tanh") : x, weight, bias);
  const bool rowwise = scaling == Fp8Scaling::kRowwise;
  if (rowwise && !x.is_cuda())
    throw Error(
        "fabric.fp8.recipe: rowwise: float8 GEMMs with a scale per row run on CUDA only ("
        "LibTorch's CPU _scaled_mm takes one scale per tensor); use tensorwise on " +
        x.device().str());
  const auto [amax, seeded] = history_inputs(scaling, history, x);
  return Fp8Linear::apply(x, weight, or_empty(bias, weight), rowwise, amax, seeded,
                          records(scaling, x, weight), gelu_tanh_input, fast_accumulation,
                          grad_margin(history));
}

torch::Tensor fp8_gelu_mlp(const torch::Tensor& x, const torch::Tensor& w1, const torch::Tensor& b1,
                           const torch::Tensor& w2, const torch::Tensor& b2, Fp8Scaling scaling,
                           Fp8History* history1, Fp8History* history2, bool fast1, bool fast2) {
  const int64_t m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (scaling == Fp8Scaling::kRowwise || !fits(m, w1.size(1), w1.size(0)) ||
      !fits(m, w2.size(1), w2.size(0)))
    return fp8_linear(fp8_linear(x, w1, b1, scaling, history1, false, fast1), w2, b2, scaling,
                      history2, /*gelu_tanh_input=*/true, fast2);
  const auto [amax1, seeded1] = history_inputs(scaling, history1, x);
  const auto [amax2, seeded2] = history_inputs(scaling, history2, x);
  const bool record1 = records(scaling, x, w1);
  // The second layer's input (the first's output) needs a gradient when anything before it does.
  const bool record2 = record1 || records(scaling, or_empty(b1, w1), w2);
  return Fp8GeluMlp::apply(x, w1, or_empty(b1, w1), w2, or_empty(b2, w2), amax1, seeded1, amax2,
                           seeded2, record1, record2, fast1, fast2, grad_margin(history1),
                           grad_margin(history2));
}

std::vector<torch::Tensor> fp8_linears(const torch::Tensor& x, const std::vector<Fp8Layer>& layers,
                                       Fp8Scaling scaling) {
  auto separate = [&] {
    std::vector<torch::Tensor> ys;
    for (const Fp8Layer& l : layers)
      ys.push_back(fp8_linear(x, l.weight, l.bias, scaling, l.history, false, l.fast_accumulation));
    return ys;
  };
  const bool rowwise = scaling == Fp8Scaling::kRowwise;
  if (layers.size() < 2 || x.dim() < 1 || (rowwise && !x.is_cuda())) return separate();
  const int64_t k = x.size(-1), m = x.numel() / std::max<int64_t>(k, 1);
  const bool record = records(scaling, x, layers[0].weight);
  const bool fast = layers[0].fast_accumulation;
  std::vector<torch::Tensor> weights, biases, amaxes, seeded;
  std::vector<int64_t> margins;
  for (const Fp8Layer& l : layers) {
    if (l.weight.dim() != 2 || l.weight.size(1) != k || !fits(m, k, l.weight.size(0)) ||
        l.fast_accumulation != fast || records(scaling, x, l.weight) != record)
      return separate();
    const auto [amax, s] = history_inputs(scaling, l.history, x);
    // The input's history seeded in every layer or in none (else each scales as it alone would).
    if (s.numel() > 0 && !seeded.empty() && s.data_ptr<bool>()[0] != seeded[0].data_ptr<bool>()[0])
      return separate();
    weights.push_back(l.weight);
    biases.push_back(or_empty(l.bias, l.weight));
    amaxes.push_back(amax);
    seeded.push_back(s);
    margins.push_back(grad_margin(l.history));
  }
  return Fp8SharedInput::apply(x, at::TensorList(weights), at::TensorList(biases),
                               at::TensorList(amaxes), at::TensorList(seeded), margins, rowwise,
                               record, fast);
}

}  // namespace fabric::nn
