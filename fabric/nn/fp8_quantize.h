// fp8-mixed's quantization of one GEMM operand (fabric/nn/fp8_gemm.cc uses it): the scaled,
// saturated float8 cast, row-major and transposed, tensorwise (dynamic or delayed, with
// Fp8History's row) or rowwise, through the CUDA kernels (fabric/nn/kernels/fp8_cast.h) where
// they apply, else ATen's ops, with the same values. Internal to //fabric/nn:tensor_parallel.
#ifndef FABRIC_NN_FP8_QUANTIZE_H_
#define FABRIC_NN_FP8_QUANTIZE_H_

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace fabric::nn::detail {

inline constexpr double kE4m3Max = 448.0;
inline constexpr double kE5m2Max = 57344.0;

// A [rows, cols] tensor as float8 of `dtype`, scaled so that the largest magnitude of the tensor
// (tensorwise) or of each line (rowwise) becomes the format's largest: row-major q, and qt, the
// transpose ([cols, rows] row-major: the column-major operand _scaled_mm wants in backward), with
// the scales that undo them (float32): t ≈ q · rows_inverse, tᵀ ≈ qt · cols_inverse. Tensorwise,
// both are one scalar; rowwise, q's row r has rows_inverse[r] and qt's row c (t's column c)
// cols_inverse[c].
struct Quantized {
  torch::Tensor q, qt, rows_inverse, cols_inverse;
};

// Delayed scaling's view of one operand (Fp8History): its history row ([length + 1] float32 on the
// operand's device), whether its own amax seeds the history first, whether the cast takes its
// amax and pushes it in, and its margin: the scale leaves 2^margin of headroom above the
// history's largest amax (largest · 2^-margin / h).
struct Delayed {
  torch::Tensor row;
  bool seed = false, record = false;
  int margin = 0;
};

// FABRIC_FP8_CAST_GRID (docs/building.md): wave (the default) or tile, for the CUDA cast kernels
// of this process; fabric::Error for any other value. fabric::nn::convert_to_fp8 calls it.
void read_cast_grid_setting();

// Whether quantize() takes t to the CUDA kernels (else ATen's ops).
bool kernel_path(const torch::Tensor& t);

// What quantize() casts when it is not t itself: an elementwise function of t and the tensors a
// and b (t's dtype and shape; undefined where the op takes none), one of fp8_cast.h's Fp8Op (the
// same list, the same values): computed by the CUDA cast kernels as they read them (tensorwise),
// else by ATen's ops first (pointwise_aten); the same values either way.
struct Pointwise {
  enum class Op { kNone, kGeluTanh, kGeluTanhGrad, kSwiglu, kSwigluGateGrad, kSwigluUpGrad };
  Pointwise(Op op = Op::kNone, torch::Tensor a = {}, torch::Tensor b = {})  // NOLINT: {op, a}
      : op(op), a(std::move(a)), b(std::move(b)) {}
  Op op;
  torch::Tensor a, b;
};

// f's values by the ATen ops a model without the fusion runs (t itself for kNone):
// gelu(t, "tanh"), gelu_backward(t, a, "tanh"), silu(t) · a, silu_backward(t · b, a) and
// t · silu(a) (the last two: the gate's and the up's gradient of silu(gate) · up, as autograd
// computes them).
torch::Tensor pointwise_aten(const torch::Tensor& t, const Pointwise& f);

// t [rows, cols] (f's values of it) quantized to `dtype` (largest: its largest finite value).
// delayed (tensorwise only; may be null): the scale from the history row, which it reads and
// (recording) advances. col_sum (may be null): set to the column sums in float32 when the cast
// kernel took them (the CUDA kernels, tensorwise) or when f has an op, else left alone (the
// caller sums t). amax (may be undefined; read by the tensorwise cast without delayed scaling
// only, on CUDA and on the CPU): the largest magnitude of f's values, taken already
// (swiglu_grad_amaxes, or the norm that wrote t), so the cast makes no pass of its own for it.
Quantized quantize(const torch::Tensor& t, c10::ScalarType dtype, double largest, bool rowwise,
                   const Delayed* delayed = nullptr, torch::Tensor* col_sum = nullptr,
                   const Pointwise& f = {}, const torch::Tensor& amax = {});

// The largest magnitudes of SwiGLU's two gradients (Pointwise kSwigluGateGrad of dy with gate and
// up, kSwigluUpGrad of dy with gate) from one pass over the three tensors, as quantize()'s amax
// (float32 scalars on the device): tensorwise scaling then reads them once, not once per cast.
// Undefined tensors where the CUDA kernels do not apply (each cast takes its own).
std::pair<torch::Tensor, torch::Tensor> swiglu_grad_amaxes(const torch::Tensor& dy,
                                                           const torch::Tensor& gate,
                                                           const torch::Tensor& up);

// The weight operand's cast (e4m3; history's row 1 under delayed scaling: delayed_operand's), kept
// while the weight is unchanged (fp8_weight_cache.cc; fp8.h's release_fp8_weights): a later pass
// over the same weight reuses it instead of casting again. The same bits as quantize() except
// under delayed scaling, where the weight's history row advances once per change of the weight,
// in its first training pass, and every pass over it reads the scale that pass read.
Quantized quantize_weight(const torch::Tensor& weight, bool rowwise, const torch::Tensor& history,
                          const torch::Tensor& seeded, bool record);

// history[0 .. n) of a history row ([n + 1] float32) one place older, history[n] (a recorded
// amax) at 0 and history[n] zeroed (fp8_history_push's contract), on the row's device.
void push_history(const torch::Tensor& row);

// q [rows, cols] (float8, row-major) transposed: [cols, rows] row-major (fp8_transpose on CUDA
// where the kernels apply, else ATen's copy).
torch::Tensor transposed(const torch::Tensor& q);

// Operand i's delayed scaling for this pass (nullopt: dynamic). `history` [3, length + 1] (no
// elements: not delayed), `seeded` [3] bool on the CPU (set for i by a recording pass); `record`:
// a training pass; margin: Delayed's (0 on the pass that seeds the history).
std::optional<Delayed> delayed_operand(const torch::Tensor& history, const torch::Tensor& seeded,
                                       int64_t i, bool record, int margin = 0);

}  // namespace fabric::nn::detail

#endif  // FABRIC_NN_FP8_QUANTIZE_H_
