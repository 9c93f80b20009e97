#include "fabric/nn/fp8_gemm.h"

#include <ATen/autocast_mode.h>
#include <ATen/ops/_scaled_mm.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "fabric/core/error.h"

namespace fabric::nn::detail {

using torch::autograd::AutogradContext;

namespace {

// _scaled_mm's scale of an operand: the scalar, or (rowwise) its lines as [M, 1] for the first
// operand and [1, N] for the second.
torch::Tensor scale_a(const torch::Tensor& inverse) {
  return inverse.dim() == 0 ? inverse : inverse.view({-1, 1});
}
torch::Tensor scale_b(const torch::Tensor& inverse) {
  return inverse.dim() == 0 ? inverse : inverse.view({1, -1});
}

// An operand of a CPU float8 GEMM in float32, times its scale(s) (as ATen's emulation does).
torch::Tensor dequantized(const torch::Tensor& q, const torch::Tensor& s) {
  const torch::Tensor f = q.contiguous().to(torch::kFloat);
  return s.numel() == 1 ? at::mul(f, s.item<float>()) : at::mul(f, s);
}

// a [M, K] row-major, b [K, N] column-major (b = w8.t() of a row-major w8 [N, K]). Recorded as
// fabric::fp8_gemm (the profiler's name for our float8 GEMMs, on either device).
torch::Tensor scaled_mm(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& sa,
                        const torch::Tensor& sb, c10::ScalarType out, bool fast,
                        const std::optional<torch::Tensor>& bias = std::nullopt) {
  RECORD_FUNCTION("fabric::fp8_gemm", std::vector<c10::IValue>());
  if (!a.is_cpu())
    return at::_scaled_mm(a, b, sa, sb, bias, /*scale_result=*/std::nullopt, out, fast);
  // The CPU: the arithmetic of LibTorch's emulated _scaled_mm (float32 operands times their
  // scales, one float32 matmul, the bias, then the output type), which LibTorch itself runs only
  // on CPUs without AMX-int8: on those with it, it hands the GEMM to oneDNN, whose float8 path
  // took about 13 ms for a GEMM of a 0.1M-parameter model (126 GEMMs, 97% of a step 90x
  // bf16-mixed's; 2-vCPU Xeon with AMX, docs/benchmarks.md). The same arithmetic on every CPU.
  torch::Tensor y = at::matmul(dequantized(a, sa), dequantized(b, sb));
  if (bias) y.add_(*bias);
  return y.to(out);
}

}  // namespace

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

// One Linear's forward in float8 (every node's): y [M, N] = x2 [M, K] · weightᵀ + bias (bias: no
// elements for none) in `out`. history, seeded: Fp8History's tensors under delayed scaling (no
// elements otherwise); record: the pass trains; f: the input is f's values of x2 (the CUDA
// kernels compute them as they read x2); fast: fp8_linear's fast_accumulation.

// forward_gemm's first operand: x2 (f's values of it) in e4m3, with history's row 0.
Quantized quantize_input(const torch::Tensor& x2, bool rowwise, const torch::Tensor& history,
                         const torch::Tensor& seeded, bool record, const Pointwise& f,
                         const torch::Tensor& amax) {
  const auto dx = delayed_operand(history, seeded, 0, record);
  return quantize(x2, torch::kFloat8_e4m3fn, kE4m3Max, rowwise, dx ? &*dx : nullptr, nullptr, f,
                  amax);
}

// forward_gemm with its input quantized already (qx: quantize_input's; Fp8SharedInput's layers).
Fp8Forward weight_gemm(const Quantized& qx, const torch::Tensor& weight, const torch::Tensor& bias,
                       c10::ScalarType out, bool rowwise, const torch::Tensor& history,
                       const torch::Tensor& seeded, bool record, bool fast) {
  const Quantized qw = quantize_weight(weight, rowwise, history, seeded, record);
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
                        const Pointwise& f, bool fast, const torch::Tensor& amax) {
  const Quantized qx = quantize_input(x2, rowwise, history, seeded, record, f, amax);
  return weight_gemm(qx, weight, bias, out, rowwise, history, seeded, record, fast);
}

// The three gradients of one float8 Linear from its output gradient g2 [M, N] and forward_gemm's
// x8t [K, M], sx, w8t [K, N], sw (rowwise: each row k with sx[k] / sw[k]). through: the layer's
// output gradient is through's values of g2 (the gradient through the GELU or the SwiGLU after
// the layer, computed by the CUDA cast as it reads g2 and the activation's saved inputs;
// fp8_quantize.h). grad_b is undefined without a bias.

Fp8Grads backward_gemms(const torch::Tensor& g2, const Pointwise& through, const torch::Tensor& x8t,
                        const torch::Tensor& sx, const torch::Tensor& w8t, const torch::Tensor& sw,
                        c10::ScalarType x_dtype, c10::ScalarType w_dtype,
                        std::optional<c10::ScalarType> b_dtype, bool rowwise, bool fast,
                        const torch::Tensor& history, const torch::Tensor& seeded,
                        int64_t grad_margin, bool need_x, bool need_w, const torch::Tensor& amax) {
  // Rowwise quantizes the gradient to e4m3 as well (as torchao's rowwise recipe does: a scale
  // per row covers the range e5m2's exponent bits are for, and the rowwise GEMM takes e4m3).
  const auto dg =
      delayed_operand(history, seeded, 2, /*record=*/true, static_cast<int>(grad_margin));
  // The bias's gradient (the rows' sum, in float32) from the gradient's cast when its kernel
  // takes it (or, through an activation, from quantize's own values), else below.
  torch::Tensor bias_sum;
  torch::Tensor* sum = b_dtype ? &bias_sum : nullptr;
  const Quantized qg =
      rowwise ? quantize(g2, torch::kFloat8_e4m3fn, kE4m3Max, true, nullptr, sum, through)
              : quantize(g2, torch::kFloat8_e5m2, kE5m2Max, false, dg ? &*dg : nullptr, sum,
                         through, amax);
  Fp8Grads out;
  // grad_x [M, K] = g [M, N] · w [N, K]: w as a column-major [N, K].
  if (need_x)
    out.x = scaled_mm(qg.q, w8t.t(), scale_a(qg.rows_inverse), scale_b(sw),
                      rowwise ? torch::kBFloat16 : x_dtype, fast)
                .to(x_dtype);
  // grad_w [N, K] = gᵀ [N, M] · x [M, K]: gᵀ row-major, x column-major.
  if (need_w)
    out.w = scaled_mm(qg.qt, x8t.t(), scale_a(qg.cols_inverse), scale_b(sx),
                      rowwise ? torch::kBFloat16 : torch::kFloat, fast)
                .to(w_dtype);
  if (b_dtype) {
    if (!bias_sum.defined()) bias_sum = g2.sum(0, /*keepdim=*/false, torch::kFloat);
    out.b = bias_sum.to(*b_dtype);
  }
  return out;
}

std::optional<c10::ScalarType> optional_dtype(const c10::IValue& v) {
  if (v.isNone()) return std::nullopt;
  return static_cast<c10::ScalarType>(v.toInt());
}

std::optional<c10::ScalarType> bias_dtype(const AutogradContext* ctx, const char* key) {
  return optional_dtype(ctx->saved_data.at(key));
}

c10::ScalarType saved_dtype(const AutogradContext* ctx, const char* key) {
  return static_cast<c10::ScalarType>(ctx->saved_data.at(key).toInt());
}

c10::IValue dtype_or_none(const torch::Tensor& bias) {
  return bias.numel() > 0 ? c10::IValue(static_cast<int64_t>(bias.scalar_type())) : c10::IValue();
}

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

void check_input(const Fp8Input& input, const torch::Tensor& x, const torch::Tensor& weight,
                 Fp8Scaling scaling, bool gelu) {
  const int64_t k = weight.size(1), m = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (!input.q.defined()) {  // an amax alone (tensorwise)
    if (scaling != Fp8Scaling::kTensorwise || gelu || !input.amax.defined() ||
        input.amax.numel() != 1 || input.amax.scalar_type() != torch::kFloat ||
        input.amax.device() != x.device() || x.size(-1) != k)
      throw Error("fp8-mixed: an input amax taken by its producer does not fit the layer (input " +
                  c10::str(x.sizes()) + ", weight " + c10::str(weight.sizes()) +
                  "): only tensorwise scaling takes one, a float32 scalar on the input's device");
    return;
  }
  const bool ok = scaling == Fp8Scaling::kDelayed && !gelu && input.q.defined() &&
                  input.qt.defined() && input.inverse.defined() && input.q.dim() == 2 &&
                  input.q.size(0) == m && input.q.size(1) == k && x.size(-1) == k &&
                  input.q.scalar_type() == torch::kFloat8_e4m3fn &&
                  input.qt.sizes() == torch::IntArrayRef({k, m}) && input.inverse.numel() == 1 &&
                  input.q.device() == x.device() && fits(m, k, weight.size(0));
  if (!ok)
    throw Error("fp8-mixed: a float8 input made by its producer does not fit the layer (q " +
                (input.q.defined() ? c10::str(input.q.sizes(), " ", input.q.scalar_type())
                                   : std::string("undefined")) +
                ", input " + c10::str(x.sizes()) + ", weight " + c10::str(weight.sizes()) +
                "): only delayed scaling takes one, for an input of the layer's width");
}

Quantized made_input(const Fp8Input& input) {
  return {input.q, input.qt, input.inverse, input.inverse};
}

Quantized node_input(const torch::Tensor& x, int64_t k, const Fp8Input* input, bool rowwise,
                     const torch::Tensor& history, const torch::Tensor& seeded, bool record) {
  if (input != nullptr && input->q.defined()) return made_input(*input);
  return quantize_input(x.reshape({-1, k}).contiguous(), rowwise, history, seeded, record, {},
                        input != nullptr ? input->amax : torch::Tensor());
}

void check_shared_input(const Fp8Input& input, const torch::Tensor& x,
                        const std::vector<Fp8Layer>& layers, Fp8Scaling scaling) {
  const bool delayed = scaling == Fp8Scaling::kDelayed;
  if (scaling == Fp8Scaling::kRowwise || !can_share_input(x, layers, scaling) ||
      (delayed && !history_inputs(scaling, layers[0].history, x).second.data_ptr<bool>()[0]))
    throw Error(
        "fp8-mixed: a float8 input made by its producer is shared only by layers that take one "
        "cast of it (delayed or tensorwise scaling, one fast_accumulation, sizes _scaled_mm "
        "takes, delayed input histories seeded)");
  check_input(input, x, layers[0].weight, scaling, false);
}

bool can_share_input(const torch::Tensor& x, const std::vector<Fp8Layer>& layers,
                     Fp8Scaling scaling) {
  if (layers.size() < 2 || x.dim() < 1) return false;
  const int64_t k = x.size(-1), m = x.numel() / std::max<int64_t>(k, 1);
  const bool record = records(scaling, x, layers[0].weight);
  std::optional<bool> seeded;
  for (const Fp8Layer& l : layers) {
    if (l.weight.dim() != 2 || l.weight.size(1) != k || !fits(m, k, l.weight.size(0)) ||
        l.fast_accumulation != layers[0].fast_accumulation ||
        records(scaling, x, l.weight) != record)
      return false;
    const torch::Tensor s = history_inputs(scaling, l.history, x).second;
    if (s.numel() == 0) continue;
    const bool done = s.data_ptr<bool>()[0];
    if (seeded && *seeded != done) return false;
    seeded = done;
  }
  return true;
}

void share_input_row(const torch::Tensor& from, const torch::Tensor& to,
                     const torch::Tensor& to_seeded) {
  (void)delayed_operand(to, to_seeded, 0, /*record=*/true);  // marks it seeded
  to.select(0, 0).copy_(from.select(0, 0));
}

torch::Tensor or_empty(const torch::Tensor& bias, const torch::Tensor& weight) {
  return bias.defined() ? bias : torch::empty({0}, weight.options());
}

}  // namespace fabric::nn::detail
