// fabric::nn float8 training (fabric.precision: fp8-mixed): a Linear layer's three GEMMs in
// float8 through at::_scaled_mm, with dynamic tensorwise scaling.
//
// fp8_linear(x, w, b), forward: x and w are scaled so that their largest magnitude becomes
// float8_e4m3fn's largest (448), cast to e4m3, multiplied by _scaled_mm with the inverse scales
// and a 16-bit (autocast's dtype) or x's-dtype result; the bias is added after. Backward: the
// output gradient is scaled to float8_e5m2 (largest 57344; more range, less precision) and the two
// gradient GEMMs run in float8 too: grad_x = g · w (e5m2 x e4m3), grad_w = gᵀ · x (e5m2 x e4m3,
// float32 result for the float32 master weight). The scales are computed from this step's
// tensors (no history). A GEMM whose sizes _scaled_mm cannot take (a dimension not a multiple of
// 16) runs as ATen's linear instead, in the same call.
//
// Where it runs: CUDA devices of compute capability 8.9 or newer (Ada, Hopper, Blackwell), and the
// CPU (LibTorch 2.11 has a tensorwise _scaled_mm there: for checking numerics, not for speed).
//
// convert_to_fp8() turns it on for the fabric::nn::Linear layers of a module (the strategy's
// setup does, under fp8-mixed: Strategy::convert_module).
#ifndef FABRIC_NN_FP8_H_
#define FABRIC_NN_FP8_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

namespace fabric::nn {

// How the scales are taken (fabric.fp8.recipe): one per tensor, or one per row of each GEMM
// operand (rowwise: x and the output gradient per token, the weight per output and per input
// feature; gradients in e4m3 too; CUDA only, compute capability >= 9.0; the GEMMs write bf16).
enum class Fp8Scaling { kTensorwise, kRowwise };

// x [..., K], weight [N, K] (float32 master or 16-bit), bias [N] or undefined → [..., N].
// Rowwise on a CPU tensor throws fabric::Error (LibTorch's CPU _scaled_mm is tensorwise only).
torch::Tensor fp8_linear(const torch::Tensor& x, const torch::Tensor& weight,
                         const torch::Tensor& bias, Fp8Scaling scaling = Fp8Scaling::kTensorwise);

// Whether `device` can run float8 GEMMs with `scaling`; `why_not` (when given) receives the
// reason otherwise ("compute capability 8.0 < 8.9").
bool fp8_supported(const torch::Device& device, std::string* why_not = nullptr,
                   Fp8Scaling scaling = Fp8Scaling::kTensorwise);

struct Fp8Conversion {
  std::vector<std::string> converted;  // fabric::nn::Linear layers now in float8
  std::vector<std::string> excluded;   // matched a pattern of `exclude`
  std::vector<std::string> unmatched;  // patterns of `exclude` no fabric::nn::Linear matched
  std::vector<std::string> unfit;      // in or out features not a multiple of 16
  std::vector<std::string> plain;      // torch::nn::Linear layers (cannot be converted)
};

// Turns float8 GEMMs on for every fabric::nn::Linear of `module` except those whose name matches
// a pattern of `exclude` (the plan pattern syntax of tensor_parallel.h: '*' is one name
// component) and those whose sizes _scaled_mm cannot take, with `scaling`. Returns what it did.
Fp8Conversion convert_to_fp8(torch::nn::Module& module, const std::vector<std::string>& exclude,
                             Fp8Scaling scaling = Fp8Scaling::kTensorwise);

}  // namespace fabric::nn

#endif  // FABRIC_NN_FP8_H_
