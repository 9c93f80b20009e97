// The pieces fp8-mixed's autograd nodes share (fp8.cc's Fp8Linear, fp8_gelu_mlp.cc's Fp8GeluMlp,
// fp8_shared_input.cc's Fp8SharedInput): one Linear's forward and backward GEMMs in float8 through
// at::_scaled_mm, with their operands quantized by fp8_quantize.h, and the arguments the nodes
// pass and save. Internal to //fabric/nn:tensor_parallel.
#ifndef FABRIC_NN_FP8_GEMM_H_
#define FABRIC_NN_FP8_GEMM_H_

#include <torch/autograd.h>
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_quantize.h"

namespace fabric::nn::detail {

// Whether _scaled_mm takes an [m, k] x [k, n] GEMM (every size a positive multiple of 16).
bool fits(int64_t m, int64_t k, int64_t n);

// The product's dtype for input x: autocast's on x's device, else x's.
c10::ScalarType output_dtype(const torch::Tensor& x);

// One Linear's forward in float8: y [M, N] in `out`, and the transposed operands with their
// scales that its backward reads (x8t [K, M], w8t [K, N]).
struct Fp8Forward {
  torch::Tensor y, x8t, sx, w8t, sw;
};

// The layer's input x2 [M, K] (f's values of it: a GELU's or a SwiGLU's output) in e4m3, with
// history's row 0; amax (tensorwise, may be undefined): x2's largest magnitude taken by its
// producer (Fp8Input's).
Quantized quantize_input(const torch::Tensor& x2, bool rowwise, const torch::Tensor& history,
                         const torch::Tensor& seeded, bool record, const Pointwise& f = {},
                         const torch::Tensor& amax = {});

// The forward with its input quantized already (quantize_input's): the weight quantized with
// history's row 1, the GEMM, the bias (no elements for none).
Fp8Forward weight_gemm(const Quantized& qx, const torch::Tensor& weight, const torch::Tensor& bias,
                       c10::ScalarType out, bool rowwise, const torch::Tensor& history,
                       const torch::Tensor& seeded, bool record, bool fast);

// quantize_input, then weight_gemm.
Fp8Forward forward_gemm(const torch::Tensor& x2, const torch::Tensor& weight,
                        const torch::Tensor& bias, c10::ScalarType out, bool rowwise,
                        const torch::Tensor& history, const torch::Tensor& seeded, bool record,
                        const Pointwise& f, bool fast, const torch::Tensor& amax = {});

// A Linear's three gradients (b undefined without a bias).
struct Fp8Grads {
  torch::Tensor x, w, b;
};

// The gradients from the output gradient g2 [M, N] and forward_gemm's saved operands; `through`:
// what the layer's output gradient is of g2 (an activation's gradient, from g2, its output
// gradient, and its saved inputs). The gradient is quantized with history's row 2 and
// grad_margin (Fp8History's); amax (may be undefined): its largest magnitude taken already
// (quantize's, dynamic tensorwise only). need_x, need_w: whether x's and the weight's gradients
// are wanted (a frozen weight's GEMM is not run; the field stays undefined); the gradient is
// quantized (and its history advanced) either way.
Fp8Grads backward_gemms(const torch::Tensor& g2, const Pointwise& through, const torch::Tensor& x8t,
                        const torch::Tensor& sx, const torch::Tensor& w8t, const torch::Tensor& sw,
                        c10::ScalarType x_dtype, c10::ScalarType w_dtype,
                        std::optional<c10::ScalarType> b_dtype, bool rowwise, bool fast,
                        const torch::Tensor& history, const torch::Tensor& seeded,
                        int64_t grad_margin, bool need_x = true, bool need_w = true,
                        const torch::Tensor& amax = {});

// A dtype saved as dtype_or_none wrote it (None: no bias).
std::optional<c10::ScalarType> optional_dtype(const c10::IValue& v);
std::optional<c10::ScalarType> bias_dtype(const torch::autograd::AutogradContext* ctx,
                                          const char* key);
c10::ScalarType saved_dtype(const torch::autograd::AutogradContext* ctx, const char* key);
c10::IValue dtype_or_none(const torch::Tensor& bias);

// Fp8History's tensors as a node's inputs: the history (made on x's device at first use) and
// seeded, or no elements when not delayed; fabric::Error when delayed has no history.
std::pair<torch::Tensor, torch::Tensor> history_inputs(Fp8Scaling scaling, Fp8History* history,
                                                       const torch::Tensor& x);

// Whether a delayed layer's pass with input x and `weight` advances its history (fp8.h).
bool records(Fp8Scaling scaling, const torch::Tensor& x, const torch::Tensor& weight);

// The output gradient's margin (delayed scaling's; 0 otherwise, where it is not read).
int64_t grad_margin(const Fp8History* history);

// Whether `layers` (2 or more) reading x can take one cast of it (Fp8SharedInput's, and the
// SwiGLU node's gate and up): each a 2-d weight over x's last size whose GEMM fits _scaled_mm,
// one fast_accumulation, one answer to records(), and x's history seeded in all or in none
// (else each would scale as it alone does). Makes delayed histories (history_inputs).
bool can_share_input(const torch::Tensor& x, const std::vector<Fp8Layer>& layers,
                     Fp8Scaling scaling);

// After a recording pass cast x with `from`'s history (its input row advanced): `to`'s input
// row and seeded flag as its own cast of the same x would have left them.
void share_input_row(const torch::Tensor& from, const torch::Tensor& to,
                     const torch::Tensor& to_seeded);

// A made cast (Fp8Input) handed to a node for x: fabric::Error unless the layer is delayed, reads
// x itself (no GELU before it) and q is [x's rows, K] float8_e4m3fn with a scalar inverse on x's
// device (the stand-in is never read, so nothing else would catch a mismatch); or, an amax alone,
// unless the layer is tensorwise, reads x itself and the amax is one float32 on x's device.
void check_input(const Fp8Input& input, const torch::Tensor& x, const torch::Tensor& weight,
                 Fp8Scaling scaling, bool gelu);

// A made cast as the Quantized input a node's GEMMs read (one scale: rows' and columns' alike).
Quantized made_input(const Fp8Input& input);

// The node's input in e4m3 (quantize_input's, history's row 0): input's made cast when it has
// bytes (delayed: x a stand-in, never read), else x cast, with input's amax when given.
Quantized node_input(const torch::Tensor& x, int64_t k, const Fp8Input* input, bool rowwise,
                     const torch::Tensor& history, const torch::Tensor& seeded, bool record);

// check_input for layers that share one made cast (fp8_linears, fp8_swiglu_mlp's gate and up):
// also fabric::Error unless they can take one cast (can_share_input) and, delayed, the first
// layer's input history, whose scale the cast used, is seeded.
void check_shared_input(const Fp8Input& input, const torch::Tensor& x,
                        const std::vector<Fp8Layer>& layers, Fp8Scaling scaling);

// The cast a delayed layer (its history, weight) would make of an input of like's sizes (all but
// the last) and device, when its producer can make it this pass: the input history seeded, the
// GEMM fitting _scaled_mm; q and inverse allocated, record set when gradients are on. A
// tensorwise layer's (the GEMM fitting): amax alone, zero. nullopt otherwise (rowwise; the layer
// casts for itself).
std::optional<Fp8InputCast> input_cast_for(Fp8Scaling scaling, Fp8History* history,
                                           const torch::Tensor& like, const torch::Tensor& weight);

// After the producer took the cast: the history pushed when the pass trains (its record cleared
// when it does not), and qt; tensorwise: the amax alone.
Fp8Input finish_input_cast(const Fp8InputCast& cast, bool trains);

// bias, or a tensor with no elements for none (an undefined tensor cannot be a node's input).
torch::Tensor or_empty(const torch::Tensor& bias, const torch::Tensor& weight);

}  // namespace fabric::nn::detail

#endif  // FABRIC_NN_FP8_GEMM_H_
