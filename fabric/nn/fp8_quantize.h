// fp8-mixed's quantization of one GEMM operand (fabric/nn/fp8_gemm.cc uses it): the scaled,
// saturated float8 cast, row-major and transposed, tensorwise (dynamic or delayed, with
// Fp8History's row) or rowwise, through the CUDA kernels (fabric/nn/kernels/fp8_cast.h) where
// they apply, else ATen's ops, with the same values. Internal to //fabric/nn:tensor_parallel.
#ifndef FABRIC_NN_FP8_QUANTIZE_H_
#define FABRIC_NN_FP8_QUANTIZE_H_

#include <torch/types.h>

#include <cstdint>
#include <optional>

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

// t [rows, cols] quantized to `dtype` (largest: its largest finite value). delayed (tensorwise
// only; may be null): the scale from the history row, which it reads and (recording) advances.
// col_sum (may be null): set to t's column sums in float32 when the cast kernel took them (the
// CUDA kernels, tensorwise), else left alone (with gelu_grad_pre: always set, the sums of the
// gradient through the GELU). gelu: quantize gelu_tanh(t) instead (REQUIRES:
// kernel_path(t) and tensorwise; otherwise the caller applies torch::gelu first).
// gelu_grad_pre (may be undefined; not with gelu): t is the gradient of gelu_tanh's output and
// gelu_grad_pre its pre-activation: quantizes torch::gelu_backward(t, gelu_grad_pre, "tanh"),
// computed by the CUDA kernels as they read both (tensorwise, the same dtype and shape), else by
// ATen first; the same values either way.
Quantized quantize(const torch::Tensor& t, c10::ScalarType dtype, double largest, bool rowwise,
                   const Delayed* delayed = nullptr, torch::Tensor* col_sum = nullptr,
                   bool gelu = false, const torch::Tensor& gelu_grad_pre = {});

// Operand i's delayed scaling for this pass (nullopt: dynamic). `history` [3, length + 1] (no
// elements: not delayed), `seeded` [3] bool on the CPU (set for i by a recording pass); `record`:
// a training pass; margin: Delayed's (0 on the pass that seeds the history).
std::optional<Delayed> delayed_operand(const torch::Tensor& history, const torch::Tensor& seeded,
                                       int64_t i, bool record, int margin = 0);

}  // namespace fabric::nn::detail

#endif  // FABRIC_NN_FP8_QUANTIZE_H_
