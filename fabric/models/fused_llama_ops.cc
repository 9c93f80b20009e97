#include "fabric/models/fused_llama_ops.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cstdint>

#include "fabric/core/aligned.h"
#include "fabric/core/error.h"

#ifdef FABRIC_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fabric/models/kernels/llama_ops.h"
#endif

namespace fabric::models {

at::Tensor rotate_half(const at::Tensor& x) {
  const auto halves = x.chunk(2, -1);
  return at::cat({-halves[1], halves[0]}, -1);
}

namespace {

at::Tensor rotary_aten(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin) {
  return t * cos + rotate_half(t) * sin;
}

#ifdef FABRIC_WITH_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::LogitType kind(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? kernels::LogitType::kBFloat16
                                          : kernels::LogitType::kFloat16;
}

// [B, H, T, D] whose last dimension is contiguous and whose other strides keep 4-value groups
// 8-byte aligned (the kernel's loads).
bool rotary_layout(const at::Tensor& t) {
  return t.dim() == 4 && t.stride(3) == 1 && t.stride(0) % 4 == 0 && t.stride(1) % 4 == 0 &&
         t.stride(2) % 4 == 0 && starts_aligned(t, 8);
}

kernels::RotaryStrides strides_of(const at::Tensor& t) {
  return {t.stride(0), t.stride(1), t.stride(2)};
}

void launch_rotary(const at::Tensor& x, const at::Tensor& y, const at::Tensor& cos,
                   const at::Tensor& sin, bool backward) {
  check_kernel_launch(kernels::rotary(x.data_ptr(), strides_of(x), y.data_ptr(), strides_of(y),
                                      cos.data_ptr<float>(), sin.data_ptr<float>(), x.size(0),
                                      x.size(1), x.size(2), x.size(3), backward, kind(x),
                                      c10::cuda::getCurrentCUDAStream(x.device().index()).stream()),
                      "fused rotary embedding", backward ? "rotary (backward)" : "rotary");
}

struct FusedRotary : torch::autograd::Function<FusedRotary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& t, const at::Tensor& cos,
                            const at::Tensor& sin) {
    const c10::cuda::CUDAGuard guard(t.device());
    at::Tensor y = at::empty_like(t);  // t's layout (dense), so the same strides
    if (!rotary_layout(y)) y = at::empty(t.sizes(), t.options());
    launch_rotary(t, y, cos, sin, /*backward=*/false);
    ctx->save_for_backward({cos, sin});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor g = grads[0];
    const c10::cuda::CUDAGuard guard(g.device());
    if (!rotary_layout(g)) g = g.contiguous();
    // g's layout: attention's backward writes the query's gradient in the query's ([B, T, H, D]
    // memory), so dt keeps the strides of the view t was and autograd's transpose back to the
    // projection's output is free (a contiguous [B, H, T, D] dt cost a copy per layer).
    at::Tensor dt = at::empty_like(g);
    if (!rotary_layout(dt)) dt = at::empty(g.sizes(), g.options());
    launch_rotary(g, dt, saved[0], saved[1], /*backward=*/true);
    return {dt, at::Tensor(), at::Tensor()};
  }
};

struct FusedSwiGLU : torch::autograd::Function<FusedSwiGLU> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    const c10::cuda::CUDAGuard guard(gate.device());
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor y = at::empty(g.sizes(), g.options());
    check_kernel_launch(
        kernels::swiglu_forward(g.data_ptr(), u.data_ptr(), y.data_ptr(), g.numel(), kind(g),
                                c10::cuda::getCurrentCUDAStream(g.device().index()).stream()),
        "fused SwiGLU", "swiglu_forward");
    ctx->save_for_backward({g, u});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &g = saved[0], &u = saved[1];
    const c10::cuda::CUDAGuard guard(g.device());
    const at::Tensor dy = grads[0].to(g.scalar_type()).contiguous();
    at::Tensor dg = at::empty_like(g), du = at::empty_like(u);
    check_kernel_launch(
        kernels::swiglu_backward(dy.data_ptr(), g.data_ptr(), u.data_ptr(), dg.data_ptr(),
                                 du.data_ptr(), g.numel(), kind(g),
                                 c10::cuda::getCurrentCUDAStream(g.device().index()).stream()),
        "fused SwiGLU", "swiglu_backward");
    return {dg, du};
  }
};
#endif

}  // namespace

bool llama_ops_apply(const at::Tensor& t) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  return t.defined() && t.is_cuda() &&
         (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
#else
  (void)t;
  return false;
#endif
}

at::Tensor rotary_16(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (llama_ops_apply(t) && rotary_layout(t) && t.size(3) % 8 == 0 && cos.dim() == 2 &&
      cos.size(0) == t.size(2) && cos.size(1) == t.size(3) && sin.sizes() == cos.sizes() &&
      cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.is_contiguous() &&
      sin.is_contiguous() && cos.device() == t.device() && sin.device() == t.device() &&
      starts_aligned(cos) && starts_aligned(sin))
    return FusedRotary::apply(t, cos, sin);
#endif
  return rotary_aten(t, cos, sin);
}

at::Tensor swiglu_16(const at::Tensor& gate, const at::Tensor& up) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  if (llama_ops_apply(gate) && up.sizes() == gate.sizes() &&
      up.scalar_type() == gate.scalar_type() && up.device() == gate.device() &&
      (!gate.is_contiguous() || starts_aligned(gate, 8)) &&
      (!up.is_contiguous() || starts_aligned(up, 8)))
    return FusedSwiGLU::apply(gate, up);
#endif
  return at::silu(gate) * up;
}

}  // namespace fabric::models
