// fabric::models::rotary_16 / swiglu_16: the Llama family's rotary position embedding and SwiGLU
// as single CUDA kernels each way (fabric/models/kernels/llama_ops.cu), in place of ATen's chains
// (rotary: mul, chunk, neg, cat, mul, add; SwiGLU: silu, mul, and their backward's five kernels,
// with silu's output kept for backward). Same values: the kernels compute what those operators
// compute and round where they round.
//
//   q = rotary_16(q, cos, sin)   q [B, H, T, D] (any layout whose last dimension is contiguous),
//                                cos, sin [T, D]: q · cos + rotate_half(q) · sin; fused for a
//                                16-bit q and float32 angles (autocast's case: the result is
//                                ATen's float32 one rounded to q's dtype, as autocast rounds it
//                                for the attention; the gradient is q's dtype as autograd's)
//   y = swiglu_16(gate, up)      silu(gate) · up
//
// They apply (llama_ops_apply) to 16-bit (bf16, fp16) CUDA tensors when the build compiled the
// kernels, D a multiple of 8; otherwise they are the ATen formulas (what the Llama computes
// without them).
#ifndef FABRIC_MODELS_FUSED_LLAMA_OPS_H_
#define FABRIC_MODELS_FUSED_LLAMA_OPS_H_

#include <ATen/core/Tensor.h>

namespace fabric::models {

// Hugging Face's rotate_half: [-x[..., D/2:], x[..., :D/2]].
at::Tensor rotate_half(const at::Tensor& x);

// Whether the kernels take `t` (a CUDA tensor of 16 bits, the kernels built).
bool llama_ops_apply(const at::Tensor& t);

at::Tensor rotary_16(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor swiglu_16(const at::Tensor& gate, const at::Tensor& up);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_FUSED_LLAMA_OPS_H_
