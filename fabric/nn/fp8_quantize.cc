#include "fabric/nn/fp8_quantize.h"

#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "fabric/core/error.h"

#ifdef FABRIC_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fabric/core/aligned.h"
#include "fabric/nn/kernels/fp8_cast.h"
#endif

namespace fabric::nn::detail {

namespace {

// history[0 .. n) one place older, the recorded amax history[n] at 0, history[n] zeroed
// (fp8_history_push's contract).
void push_aten(const torch::Tensor& row) {
  const int64_t n = row.size(0) - 1;
  if (n > 1) row.slice(0, 1, n).copy_(row.slice(0, 0, n - 1).clone());
  row.select(0, 0).copy_(row.select(0, n));
  row.select(0, n).zero_();
}

// given_amax (may be undefined; tensorwise without delayed): t's largest magnitude, taken
// already, read instead of t's own (as the CUDA kernels read it).
Quantized quantize_aten(const torch::Tensor& t, c10::ScalarType dtype, double largest, bool rowwise,
                        const Delayed* delayed, const torch::Tensor& given_amax = {}) {
  const torch::Tensor tf = t.to(torch::kFloat);
  auto cast = [&](const torch::Tensor& scale) {
    return (tf * scale).clamp(-largest, largest).to(dtype);  // saturate, no inf
  };
  if (!rowwise) {
    // Tensorwise: the scale from t's largest magnitude, or (delayed) from the history's largest
    // finite entry, seeded with t's first; a recording pass then pushes t's in.
    torch::Tensor own;
    auto amax = [&] {
      if (!own.defined()) own = t.abs().amax().to(torch::kFloat);
      return own;
    };
    torch::Tensor reference;
    if (delayed == nullptr) {
      reference = given_amax.defined() ? given_amax.to(torch::kFloat).reshape({}) : amax();
    } else {
      const int64_t n = delayed->row.size(0) - 1;
      if (delayed->seed) delayed->row.select(0, 0).copy_(amax());
      const torch::Tensor window = delayed->row.slice(0, 0, n);
      reference = torch::where(window.abs() <= FLT_MAX, window, torch::zeros_like(window)).amax();
    }
    // (2^-margin on the numerator, as the kernel: exact, so the same bits either way.)
    const double top = delayed == nullptr ? largest : std::ldexp(largest, -delayed->margin);
    const torch::Tensor scale = top / reference.clamp_min(1e-12);
    const torch::Tensor q = cast(scale), inverse = scale.reciprocal();
    if (delayed != nullptr && delayed->record) {
      const torch::Tensor slot = delayed->row.select(0, delayed->row.size(0) - 1);
      slot.copy_(torch::maximum(slot, amax()));
      push_aten(delayed->row);
    }
    return {q, q.t().contiguous(), inverse, inverse};
  }
  const torch::Tensor rows = largest / t.abs().amax(1, true).to(torch::kFloat).clamp_min(1e-12);
  const torch::Tensor cols = largest / t.abs().amax(0, true).to(torch::kFloat).clamp_min(1e-12);
  return {cast(rows), cast(cols).t().contiguous(), rows.reciprocal().view(-1),
          cols.reciprocal().view(-1)};
}

#ifdef FABRIC_WITH_CUDA_KERNELS
// The same values and bits in two kernels (fabric/nn/kernels/fp8_cast.h) instead of six ATen
// passes over float32 copies and a transposing copy.
bool kernels_apply(const torch::Tensor& t) {
  const c10::ScalarType s = t.scalar_type();
  return t.is_cuda() && t.dim() == 2 && t.size(0) % 8 == 0 && t.size(1) % 8 == 0 &&
         (s == torch::kFloat || s == torch::kBFloat16 || s == torch::kHalf);
}

// The kernels' name for t's element type (kernels_apply's float32, bf16 or fp16).
kernels::Fp8Source source_of(const torch::Tensor& t) {
  const c10::ScalarType s = t.scalar_type();
  return s == torch::kFloat      ? kernels::Fp8Source::kFloat32
         : s == torch::kBFloat16 ? kernels::Fp8Source::kBFloat16
                                 : kernels::Fp8Source::kFloat16;
}

// Pointwise::Op lists fp8_cast.h's Fp8Op, value for value.
#define FABRIC_SAME_OP(name)                                                                     \
  static_assert(static_cast<int>(Pointwise::Op::name) == static_cast<int>(kernels::Fp8Op::name), \
                "Pointwise::Op and Fp8Op differ at " #name)
FABRIC_SAME_OP(kNone);
FABRIC_SAME_OP(kGeluTanh);
FABRIC_SAME_OP(kGeluTanhGrad);
FABRIC_SAME_OP(kSwiglu);
FABRIC_SAME_OP(kSwigluGateGrad);
FABRIC_SAME_OP(kSwigluUpGrad);
#undef FABRIC_SAME_OP

// Whether the cast kernels can compute f as they read t: tensorwise, its operands t's dtype,
// shape and device.
bool fusable(const torch::Tensor& t, bool rowwise, const Pointwise& f) {
  if (f.op == Pointwise::Op::kNone) return true;
  auto like_t = [&](const torch::Tensor& o) {
    return !o.defined() || (o.sizes() == t.sizes() && o.scalar_type() == t.scalar_type() &&
                            o.device() == t.device());
  };
  return !rowwise && like_t(f.a) && like_t(f.b);
}

// col_sum (tensorwise only; may be null): receives the column sums in float32 (the bias
// gradient), taken by the cast kernel from its read of t. f (tensorwise only): its values
// quantized, computed by the kernels as they read t and its operands.
Quantized quantize_kernels(const torch::Tensor& t, c10::ScalarType dtype, bool rowwise,
                           const Delayed* delayed, torch::Tensor* col_sum, const Pointwise& f,
                           const torch::Tensor& given_amax) {
  const c10::cuda::CUDAGuard guard(t.device());
  const torch::Tensor x = contiguous_aligned(t);  // the kernels read 16 bytes at a time
  const torch::Tensor a = f.a.defined() ? contiguous_aligned(f.a) : f.a;
  const torch::Tensor b = f.b.defined() ? contiguous_aligned(f.b) : f.b;
  const kernels::Fp8Pointwise op{static_cast<kernels::Fp8Op>(f.op),
                                 a.defined() ? a.data_ptr() : nullptr,
                                 b.defined() ? b.data_ptr() : nullptr};
  const int64_t rows = x.size(0), cols = x.size(1);
  const kernels::Fp8Source source = source_of(x);
  const auto f32 = x.options().dtype(torch::kFloat);
  const bool e5m2 = dtype == torch::kFloat8_e5m2;
  torch::Tensor q = torch::empty({rows, cols}, x.options().dtype(dtype));
  torch::Tensor qt = torch::empty({cols, rows}, x.options().dtype(dtype));
  void* stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  torch::Tensor partials;  // [row tiles, cols]: col_sum's pieces, summed below
  if (col_sum != nullptr && !rowwise)
    partials = torch::empty({(rows + kernels::kFp8SumRows - 1) / kernels::kFp8SumRows, cols}, f32);
  float* sums = partials.defined() ? partials.data_ptr<float>() : nullptr;
  auto with_sums = [&](const Quantized& out) {
    if (partials.defined()) *col_sum = partials.sum(0);
    return out;
  };
  if (delayed != nullptr) {
    // The scale from the history; the amax taken by the cast itself, then pushed in.
    float* history = delayed->row.data_ptr<float>();
    const int n = static_cast<int>(delayed->row.size(0) - 1);
    torch::Tensor inverse = torch::empty({}, f32);
    if (delayed->seed)
      check_kernel_launch(kernels::fp8_amax(x.data_ptr(), x.numel(), source, history, stream, op),
                          "fp8-mixed", "fp8_amax");
    check_kernel_launch(kernels::fp8_cast_delayed(
                            x.data_ptr(), rows, cols, source, e5m2, history, n,
                            delayed->record ? history + n : nullptr, q.data_ptr(), qt.data_ptr(),
                            inverse.data_ptr<float>(), stream, sums, op, delayed->margin),
                        "fp8-mixed", "fp8_cast_delayed");
    if (delayed->record)
      check_kernel_launch(kernels::fp8_history_push(history, n, stream), "fp8-mixed",
                          "fp8_history_push");
    return with_sums({q, qt, inverse, inverse});
  }
  if (!rowwise) {
    torch::Tensor amax = given_amax, inverse = torch::empty({}, f32);
    // The kernel reads it as one float32 on x's device (swiglu_grad_amaxes' answer).
    TORCH_INTERNAL_ASSERT(
        !amax.defined() ||
        (amax.device() == x.device() && amax.scalar_type() == torch::kFloat && amax.numel() == 1));
    if (!amax.defined()) {
      amax = torch::empty({}, f32);
      check_kernel_launch(
          kernels::fp8_amax(x.data_ptr(), x.numel(), source, amax.data_ptr<float>(), stream, op),
          "fp8-mixed", "fp8_amax");
    }
    check_kernel_launch(
        kernels::fp8_cast(x.data_ptr(), rows, cols, source, e5m2, amax.data_ptr<float>(),
                          q.data_ptr(), qt.data_ptr(), inverse.data_ptr<float>(), stream, sums, op),
        "fp8-mixed", "fp8_cast");
    return with_sums({q, qt, inverse, inverse});
  }
  torch::Tensor row_amax = torch::empty({rows}, f32), col_amax = torch::empty({cols}, f32);
  torch::Tensor row_inverse = torch::empty({rows}, f32), col_inverse = torch::empty({cols}, f32);
  check_kernel_launch(
      kernels::fp8_amax_axes(x.data_ptr(), rows, cols, source, row_amax.data_ptr<float>(),
                             col_amax.data_ptr<float>(), stream),
      "fp8-mixed", "fp8_amax_axes");
  check_kernel_launch(
      kernels::fp8_cast_axes(x.data_ptr(), rows, cols, source, e5m2, row_amax.data_ptr<float>(),
                             col_amax.data_ptr<float>(), q.data_ptr(), qt.data_ptr(),
                             row_inverse.data_ptr<float>(), col_inverse.data_ptr<float>(), stream),
      "fp8-mixed", "fp8_cast_axes");
  return {q, qt, row_inverse, col_inverse};
}
#endif

}  // namespace

void read_cast_grid_setting() {
  const char* v = std::getenv("FABRIC_FP8_CAST_GRID");
  const std::string grid = v == nullptr ? "" : v;
  const bool tile = grid == "tile";
  if (!tile && !grid.empty() && grid != "wave")
    throw Error("FABRIC_FP8_CAST_GRID='" + grid +
                "' is not a grid of fp8-mixed's cast kernels: set it to wave (the default) or "
                "tile, or unset it");
#ifdef FABRIC_WITH_CUDA_KERNELS
  kernels::fp8_set_cast_grid(tile ? kernels::Fp8CastGrid::kTile : kernels::Fp8CastGrid::kWave);
#endif
}

bool kernel_path(const torch::Tensor& t) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  return kernels_apply(t);
#else
  (void)t;
  return false;
#endif
}

namespace {

// How many operands f's op reads (a, then b).
int operands(Pointwise::Op op) {
  using Op = Pointwise::Op;
  return op == Op::kNone || op == Op::kGeluTanh ? 0 : op == Op::kSwigluGateGrad ? 2 : 1;
}

}  // namespace

torch::Tensor pointwise_aten(const torch::Tensor& t, const Pointwise& f) {
  using Op = Pointwise::Op;
  switch (f.op) {
    case Op::kNone:
      return t;
    case Op::kGeluTanh:
      return at::gelu(t, "tanh");
    case Op::kGeluTanhGrad:
      return at::gelu_backward(t, f.a, "tanh");
    case Op::kSwiglu:
      return at::silu(t) * f.a;
    case Op::kSwigluGateGrad:
      return at::silu_backward(t * f.b, f.a);
    case Op::kSwigluUpGrad:
      return t * at::silu(f.a);
  }
  return t;
}

Quantized quantize(const torch::Tensor& t, c10::ScalarType dtype, double largest, bool rowwise,
                   const Delayed* delayed, torch::Tensor* col_sum, const Pointwise& f,
                   const torch::Tensor& amax) {
  const int n = operands(f.op);
  if ((n > 0 && !f.a.defined()) || (n > 1 && !f.b.defined()))
    throw Error("fp8-mixed: a cast of op " + std::to_string(static_cast<int>(f.op)) + " needs " +
                std::to_string(n) + " operand(s) (fabric/nn/fp8_quantize.h Pointwise)");
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (kernels_apply(t) && fusable(t, rowwise, f))
    return quantize_kernels(t, dtype, rowwise, delayed, col_sum, f, amax);
#endif
  if (f.op == Pointwise::Op::kNone) return quantize_aten(t, dtype, largest, rowwise, delayed, amax);
  const torch::Tensor v = pointwise_aten(t, f);
  if (col_sum != nullptr) *col_sum = v.sum(0, /*keepdim=*/false, torch::kFloat);  // as the kernel
  return quantize(v, dtype, largest, rowwise, delayed, nullptr, {}, amax);
}

std::pair<torch::Tensor, torch::Tensor> swiglu_grad_amaxes(const torch::Tensor& dy,
                                                           const torch::Tensor& gate,
                                                           const torch::Tensor& up) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  const Pointwise gate_grad{Pointwise::Op::kSwigluGateGrad, gate, up};
  if (kernels_apply(dy) && fusable(dy, false, gate_grad)) {
    const c10::cuda::CUDAGuard guard(dy.device());
    const torch::Tensor d = contiguous_aligned(dy), g = contiguous_aligned(gate),
                        u = contiguous_aligned(up);
    const torch::Tensor both = torch::empty({2}, d.options().dtype(torch::kFloat));
    check_kernel_launch(
        kernels::fp8_amax_swiglu_grads(
            d.data_ptr(), g.data_ptr(), u.data_ptr(), d.numel(), source_of(d),
            both.data_ptr<float>(), c10::cuda::getCurrentCUDAStream(d.device().index()).stream()),
        "fp8-mixed", "fp8_amax_swiglu_grads");
    return {both.select(0, 0), both.select(0, 1)};
  }
#endif
  (void)dy, (void)gate, (void)up;
  return {};
}

void push_history(const torch::Tensor& row) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (row.is_cuda()) {
    const c10::cuda::CUDAGuard guard(row.device());
    check_kernel_launch(
        kernels::fp8_history_push(row.data_ptr<float>(), static_cast<int>(row.size(0) - 1),
                                  c10::cuda::getCurrentCUDAStream(row.device().index()).stream()),
        "fp8-mixed", "fp8_history_push");
    return;
  }
#endif
  push_aten(row);
}

torch::Tensor transposed(const torch::Tensor& q) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  const int64_t rows = q.size(0), cols = q.size(1);
  if (q.is_cuda() && q.is_contiguous() && rows % 8 == 0 && cols % 8 == 0 &&
      reinterpret_cast<uintptr_t>(q.data_ptr()) % 16 == 0) {
    const c10::cuda::CUDAGuard guard(q.device());
    torch::Tensor qt = torch::empty({cols, rows}, q.options());
    check_kernel_launch(
        kernels::fp8_transpose(q.data_ptr(), rows, cols, qt.data_ptr(),
                               c10::cuda::getCurrentCUDAStream(q.device().index()).stream()),
        "fp8-mixed", "fp8_transpose");
    return qt;
  }
#endif
  return q.t().contiguous();
}

std::optional<Delayed> delayed_operand(const torch::Tensor& history, const torch::Tensor& seeded,
                                       int64_t i, bool record, int margin) {
  if (history.numel() == 0) return std::nullopt;
  bool& done = seeded.data_ptr<bool>()[i];
  if (!done && !record) return std::nullopt;  // dynamic until its first training pass
  // (No margin on the seeding pass: its scale is the tensor's own amax, which cannot outgrow it.)
  Delayed d{history.select(0, i), !done, record, done ? margin : 0};
  done = done || record;
  return d;
}

}  // namespace fabric::nn::detail
