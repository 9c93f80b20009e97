// fabric::models::layer_norm_16 / add_layer_norm_16: LayerNorm with a 16-bit output, and the
// residual add before it, as single CUDA kernels (fabric/models/kernels/layer_norm.cu); the same
// for RMSNorm (rms_norm_16 / add_rms_norm_16, below).
//
// Under CUDA autocast (bf16 or fp16) ATen's LayerNorm runs in float32 and writes a float32 output
// that the next Linear casts to 16 bits; its backward writes the input gradient, then sums the
// weight and bias gradients in a separate kernel, and the residual add and its gradient are two
// more kernels. These functions do the same math (float32 statistics, biased variance, the output
// rounded once to 16 bits) in one kernel each way:
//   y = layer_norm_16(x, ln)                    y = LayerNorm(x) in the autocast dtype
//   auto [h, y] = add_layer_norm_16(x, d, ln)   h = x + d (float32), y = LayerNorm(h)
// Backward adds the gradient h gets elsewhere (the residual path) inside the same kernel and sums
// the weight and bias gradients in a fixed order (bitwise reproducible).
//
// They apply (layer_norm_applies) on a CUDA device under autocast with 16-bit compute, for float32
// x with a width that is a multiple of 4 and at most 2048, an elementwise-affine LayerNorm with
// float32 parameters, when the build compiled the kernels and the device gives a block the
// backward's shared memory (2 · 8 · 4 bytes per column: 100 KiB at GPT-2 XL's 1600, more than
// an sm_86/sm_89 GPU's 99); otherwise they are ATen's LayerNorm (and add), the same values to
// rounding.
#ifndef FABRIC_MODELS_FUSED_LAYER_NORM_H_
#define FABRIC_MODELS_FUSED_LAYER_NORM_H_

#include <torch/nn/modules/normalization.h>

#include <utility>

namespace fabric::nn {
struct Fp8InputCast;  // fabric/nn/fp8.h
}  // namespace fabric::nn

namespace fabric::models {

bool layer_norm_applies(const at::Tensor& x, const torch::nn::LayerNorm& ln);

at::Tensor layer_norm_16(const at::Tensor& x, const torch::nn::LayerNorm& ln);

// {x, LayerNorm(x)} with x passed back through the LayerNorm's node, for a residual block that
// adds to x after it (auto [x1, y] = keep_layer_norm_16(x, ln); … add_layer_norm_16(x1, d, ln2)):
// backward then adds the gradient x1 gets there inside the LayerNorm's backward kernel instead of
// autograd summing x's two gradients in a pass of its own (one float32 read-read-write of the
// residual stream per block). Where the kernels do not apply: {x, ln(x)}.
std::pair<at::Tensor, at::Tensor> keep_layer_norm_16(const at::Tensor& x,
                                                     const torch::nn::LayerNorm& ln);

// {x + delta, LayerNorm(x + delta)}.
// (add_layer_norm_applies: whether its kernel runs: layer_norm_applies, delta of x's sizes in the
// autocast dtype.)
bool add_layer_norm_applies(const at::Tensor& x, const at::Tensor& delta,
                            const torch::nn::LayerNorm& ln);
std::pair<at::Tensor, at::Tensor> add_layer_norm_16(const at::Tensor& x, const at::Tensor& delta,
                                                    const torch::nn::LayerNorm& ln);

// Where the two above write their normalized output as float8 instead (fp8-mixed under delayed
// scaling: the next Linear's input cast, handed out by fabric::nn::produced_forward as an
// Fp8InputCast with these fields): q ([rows, cols] float8_e4m3fn on x's device) receives the
// output, as the 16-bit output would hold it, times 448 / (the largest finite entry of
// history[0 .. length)), saturated; inverse ([] float32) the inverse of that scale; with record,
// history[length] the output's largest magnitude (an atomic maximum). Under tensorwise scaling
// (q undefined, amax given): the output is written in 16 bits as usual and amax ([] float32 on
// x's device, 0 or less) receives its largest magnitude as it holds it (an atomic maximum), which
// the next Linear's cast reads instead of a pass of its own.
struct NormFp8Target {
  at::Tensor history;  // [length + 1] float32
  bool record = false;
  at::Tensor q, inverse;
  at::Tensor amax;  // tensorwise
};

// keep_layer_norm_16 and add_layer_norm_16 with the output written to `target` only: the second
// tensor is a stand-in of the output's sizes and dtype (fabric::nn::fp8_stand_in's kind: its
// values are not the output's; its gradient is the output's); with a tensorwise target, the
// output itself. Only where layer_norm_applies (add_layer_norm_applies); fabric::Error otherwise,
// or for a target that does not fit x.
std::pair<at::Tensor, at::Tensor> keep_layer_norm_fp8(const at::Tensor& x,
                                                      const torch::nn::LayerNorm& ln,
                                                      const NormFp8Target& target);
std::pair<at::Tensor, at::Tensor> add_layer_norm_fp8(const at::Tensor& x, const at::Tensor& delta,
                                                     const torch::nn::LayerNorm& ln,
                                                     const NormFp8Target& target);

// RMSNorm (the Llama family's, fabric/models/llama.h) the same way: weight · (x ·
// rsqrt(mean(x²) + eps)) in float32, rounded once to the autocast dtype. rms_norm_aten is the
// ATen formula (Hugging Face's: the float32 product cast to x's dtype, then times the weight),
// what the others compute where rms_norm_applies is false: not on CUDA under 16-bit autocast,
// x not float32, the weight not a float32 CUDA vector of x's width, or a width that is not a
// multiple of 4 or above kMaxRmsNormWidth, or a device without the backward's shared memory
// (a width of sums per warp: 128 KiB at 4096, more than an sm_86/sm_89 GPU gives).
constexpr int64_t kMaxRmsNormWidth = 4096;
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& weight, double eps);
bool rms_norm_applies(const at::Tensor& x, const at::Tensor& weight);
at::Tensor rms_norm_16(const at::Tensor& x, const at::Tensor& weight, double eps);
// {x, RMSNorm(x)} as keep_layer_norm_16.
std::pair<at::Tensor, at::Tensor> keep_rms_norm_16(const at::Tensor& x, const at::Tensor& weight,
                                                   double eps);
// {x + delta, RMSNorm(x + delta)}.
// (add_rms_norm_applies: whether its kernel runs: rms_norm_applies, delta of x's sizes in the
// autocast dtype.)
bool add_rms_norm_applies(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight);
std::pair<at::Tensor, at::Tensor> add_rms_norm_16(const at::Tensor& x, const at::Tensor& delta,
                                                  const at::Tensor& weight, double eps);

// keep_rms_norm_16 and add_rms_norm_16 with the output written to `target` only, as
// keep_layer_norm_fp8 and add_layer_norm_fp8: only where rms_norm_applies
// (add_rms_norm_applies); fabric::Error otherwise, or for a target that does not fit x.
std::pair<at::Tensor, at::Tensor> keep_rms_norm_fp8(const at::Tensor& x, const at::Tensor& weight,
                                                    double eps, const NormFp8Target& target);
std::pair<at::Tensor, at::Tensor> add_rms_norm_fp8(const at::Tensor& x, const at::Tensor& delta,
                                                   const at::Tensor& weight, double eps,
                                                   const NormFp8Target& target);

// The target of a Linear's float8 input cast handed to a fused norm (fabric::nn::produced_forward
// and the nodes of several layers hand it out as an Fp8InputCast): its fields, the cast marked
// taken.
NormFp8Target take_fp8_target(fabric::nn::Fp8InputCast& cast);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_FUSED_LAYER_NORM_H_
