#include "fabric/models/fused_cross_entropy.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <string>

#include "fabric/core/error.h"

#ifdef FABRIC_WITH_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fabric/models/kernels/cross_entropy.h"
#endif

namespace fabric::models {

at::Tensor lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  const at::Tensor flat = logits.reshape({-1, logits.size(-1)});
  if (flat.is_cuda() && flat.scalar_type() == at::kHalf) {
    // The softmax kernel reads the float16 logits and writes float32 log-probabilities, and its
    // backward writes the gradient in float16: the float32 math of the line below without a
    // float32 copy of the step's largest tensor and a copy of its gradient. ATen has this for
    // float16 on CUDA only ("conversion is supported for Half type only"; bfloat16 and CPUs copy).
    return at::nll_loss(at::_log_softmax(flat, -1, /*half_to_float=*/true), targets.reshape({-1}));
  }
  return at::cross_entropy_loss(flat.to(at::kFloat), targets.reshape({-1}));
}

bool cuda_kernels_built() {
#ifdef FABRIC_WITH_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

namespace {

// The 16-bit type the output layer's GEMM runs in, or Undefined for the ATen path.
at::ScalarType fused_dtype(const at::Tensor& h) {
  if (!cuda_kernels_built() || !h.is_cuda()) return at::ScalarType::Undefined;
  at::ScalarType t = h.scalar_type();
  if (at::autocast::is_autocast_enabled(at::kCUDA)) t = at::autocast::get_autocast_dtype(at::kCUDA);
  return t == at::kBFloat16 || t == at::kHalf ? t : at::ScalarType::Undefined;
}

#ifdef FABRIC_WITH_CUDA_KERNELS
// torch's default ignore_index, which at::cross_entropy_loss and at::nll_loss (lm_loss) use.
constexpr int64_t kIgnoreIndex = -100;

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FusedLinearCrossEntropy : torch::autograd::Function<FusedLinearCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& h, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t dtype) {
    const auto type = static_cast<at::ScalarType>(dtype);
    const c10::cuda::CUDAGuard guard(h.device());
    const at::Tensor h2 = h.reshape({-1, h.size(-1)}).to(type);
    const at::Tensor w2 = weight.to(type);
    const at::Tensor t = targets.reshape({-1}).to(h.device(), at::kLong).contiguous();
    const int64_t rows = h2.size(0), vocab = w2.size(0);
    if (t.numel() != rows) {
      throw Error("linear_cross_entropy: " + std::to_string(t.numel()) + " targets for " +
                  std::to_string(rows) + " rows of hidden states");
    }
    at::Tensor logits = at::mm(h2, w2.t());  // [rows, vocab], becomes the gradient in place
    at::Tensor loss = at::empty({rows}, h.options().dtype(at::kFloat));
    // The number of rows that are not ignored, as torch's mean divides by: an int64 on the
    // device, which the kernel reads for the gradient's scale and the loss is divided by, so that
    // nothing here waits for the GPU.
    const at::Tensor count = t.ne(kIgnoreIndex).sum();
    const int status = kernels::softmax_cross_entropy_forward_backward(
        logits.data_ptr(), t.data_ptr<int64_t>(), loss.data_ptr<float>(), rows, vocab,
        logits.stride(0), count.data_ptr<int64_t>(), kIgnoreIndex,
        type == at::kBFloat16 ? kernels::LogitType::kBFloat16 : kernels::LogitType::kFloat16,
        c10::cuda::getCurrentCUDAStream(h.device().index()).stream());
    check_kernel_launch(status, "linear_cross_entropy", "softmax_cross_entropy_forward_backward");
    ctx->saved_data["grad"] = logits;
    ctx->saved_data["h"] = h2;
    ctx->saved_data["w"] = w2;
    ctx->saved_data["h_type"] = static_cast<int64_t>(h.scalar_type());
    ctx->saved_data["w_type"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["h_sizes"] = h.sizes().vec();
    // Ignored rows' losses are 0. With every row ignored (or none) this is 0 / 0 = NaN, as
    // at::cross_entropy_loss gives; the gradient is then zero, as ATen's.
    return loss.sum().div(count);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor g = grads[0].to(at::kFloat);
    const at::Tensor grad = ctx->saved_data["grad"].toTensor();
    const at::Tensor h2 = ctx->saved_data["h"].toTensor();
    const at::Tensor w2 = ctx->saved_data["w"].toTensor();
    const auto h_type = static_cast<at::ScalarType>(ctx->saved_data["h_type"].toInt());
    const auto w_type = static_cast<at::ScalarType>(ctx->saved_data["w_type"].toInt());
    // The incoming gradient (1, or 1/accumulation) scales the small operands, not the logits.
    at::Tensor dh = at::mm(grad, w2).to(at::kFloat).mul_(g).to(h_type);
    at::Tensor dw = at::mm(grad.t(), h2.mul(g)).to(w_type);
    return {dh.view(ctx->saved_data["h_sizes"].toIntVector()), dw, at::Tensor(), at::Tensor()};
  }
};
#endif

}  // namespace

bool fused_cross_entropy_applies(const at::Tensor& h) {
  return fused_dtype(h) != at::ScalarType::Undefined;
}

at::Tensor linear_cross_entropy(const at::Tensor& h, const at::Tensor& weight,
                                const at::Tensor& targets, bool fused) {
#ifdef FABRIC_WITH_CUDA_KERNELS
  const at::ScalarType type = fused ? fused_dtype(h) : at::ScalarType::Undefined;
  if (type != at::ScalarType::Undefined) {
    return FusedLinearCrossEntropy::apply(h, weight, targets, static_cast<int64_t>(type));
  }
#else
  (void)fused;
#endif
  return lm_loss(at::linear(h, weight), targets);
}

}  // namespace fabric::models
