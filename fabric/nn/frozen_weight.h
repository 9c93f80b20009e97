// A frozen fabric::nn::Linear weight stored in a narrower dtype than the layer computes in:
// bfloat16 (a cast) or float8_e4m3fn with one float32 scale per output row (LoRA's base,
// fabric/nn/lora.h: store_lora_base). The layer (fabric::nn::LinearImpl::forward) runs
// frozen_linear for such a weight: the weight is dequantized to the compute dtype inside the
// GEMM's autograd function and again in backward, so no dequantized copy is kept between forward
// and backward (only the stored weight and its scale are saved).
//
// The scale is the layer's buffer kWeightScale ([out], float32: weight ≈ float8 · scale[:, None]);
// a split layer cuts it like the weight's rows (column: its rows; row: whole).
#ifndef FABRIC_NN_FROZEN_WEIGHT_H_
#define FABRIC_NN_FROZEN_WEIGHT_H_

#include <torch/types.h>

#include <utility>

namespace fabric::nn {

// The buffer name of a float8 weight's per-row scale, beside "weight".
inline constexpr const char* kWeightScale = "weight_scale";

// float8_e4m3fn's largest finite magnitude.
inline constexpr double kFloat8E4m3Max = 448.0;

// Whether `weight` (with `scale`, undefined for none) is a stored frozen weight for input `x`:
// a float8 weight with a scale, or a weight that requires no gradient whose dtype differs from
// x's while autocast is off on x's device (where ATen's linear would refuse the mix).
bool is_stored_weight(const torch::Tensor& weight, const torch::Tensor& scale,
                      const torch::Tensor& x);

// `weight` in `dtype`: weight · scale[:, None] computed in float32 for a float8 weight (scale
// [out]), else the cast.
torch::Tensor dequantize_weight(const torch::Tensor& weight, const torch::Tensor& scale,
                                torch::ScalarType dtype);

// x [..., in] · dequantize_weight(weight, scale)ᵀ + bias in the compute dtype (autocast's on x's
// device, else x's). Backward: x's gradient through the dequantized weight (dequantized again),
// the bias's when it requires one; never the weight's.
torch::Tensor frozen_linear(const torch::Tensor& x, const torch::Tensor& weight,
                            const torch::Tensor& scale, const torch::Tensor& bias);

// `weight` [out, in] as float8_e4m3fn with a per-row scale: scale = amax / 448 (amax [out], each
// row's largest magnitude; given so that a row cut over ranks can pass the whole row's), rows of
// zeros scale 1. Returns {float8 weight, float32 scale [out]}.
std::pair<torch::Tensor, torch::Tensor> quantize_rows_fp8(const torch::Tensor& weight,
                                                          const torch::Tensor& amax);

}  // namespace fabric::nn

#endif  // FABRIC_NN_FROZEN_WEIGHT_H_
