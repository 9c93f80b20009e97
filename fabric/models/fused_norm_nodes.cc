// The fused LayerNorm/RMSNorm CUDA kernels (fabric/models/kernels/layer_norm.h) as autograd
// nodes: forward and backward glue, the float8 and amax targets (fused_norm_nodes.h).
#include "fabric/models/fused_norm_nodes.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/autograd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fabric/core/aligned.h"
#include "fabric/core/error.h"

#ifdef FABRIC_WITH_CUDA_KERNELS
#include <ATen/cuda/CUDAContextLight.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "fabric/models/kernels/layer_norm.h"
#endif

namespace fabric::models::detail {

at::ScalarType autocast_16(const at::Tensor& x) {
  if (!x.is_cuda() || !at::autocast::is_autocast_enabled(at::kCUDA))
    return at::ScalarType::Undefined;
  const at::ScalarType t = at::autocast::get_autocast_dtype(at::kCUDA);
  return t == at::kBFloat16 || t == at::kHalf ? t : at::ScalarType::Undefined;
}

#ifdef FABRIC_WITH_CUDA_KERNELS
// Whether x's device gives a block the shared memory the backward kernel needs for `cols` (else
// the launch would fail: the ATen path runs instead).
bool backward_fits(const at::Tensor& x, int64_t cols, bool rms) {
  const cudaDeviceProp* p = at::cuda::getDeviceProperties(x.device().index());
  return kernels::layer_norm_backward_shared_bytes(cols, rms) <=
         static_cast<int64_t>(p->sharedMemPerBlockOptin);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::LogitType kind(at::ScalarType t) {
  return t == at::kBFloat16 ? kernels::LogitType::kBFloat16 : kernels::LogitType::kFloat16;
}

// A tensor of `sizes` over one zero of `options` (zero strides): the stand-in a norm returns for
// an output it wrote as float8 only (fabric::nn::fp8_stand_in's kind).
at::Tensor stand_in(at::IntArrayRef sizes, const at::TensorOptions& options) {
  const at::Tensor zero = at::zeros({1}, options);
  const std::vector<int64_t> strides(sizes.size(), 0);
  return at::empty({0}, options).set_(zero.storage(), 0, sizes, strides);
}

// fabric::Error unless `t` can receive x's normalized output as float8, or its amax (tensorwise),
// (NormFp8Target).
void check_target(const NormFp8Target& t, const at::Tensor& x) {
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  if (!t.q.defined() && t.amax.defined()) {
    if (t.amax.scalar_type() != at::kFloat || t.amax.numel() != 1 || t.amax.device() != x.device())
      throw Error("fused LayerNorm: an amax target that does not fit the input on " +
                  x.device().str() + " (one float32 on the input's device)");
    return;
  }
  const bool ok =
      t.q.defined() && t.q.scalar_type() == at::kFloat8_e4m3fn && t.q.dim() == 2 &&
      t.q.size(0) == rows && t.q.size(1) == cols && t.q.is_contiguous() &&
      t.q.device() == x.device() && t.inverse.defined() && t.inverse.scalar_type() == at::kFloat &&
      t.inverse.numel() == 1 && t.inverse.device() == x.device() && t.history.defined() &&
      t.history.scalar_type() == at::kFloat && t.history.dim() == 1 && t.history.size(0) >= 2 &&
      t.history.is_contiguous() && t.history.device() == x.device();
  if (!ok)
    throw Error("fused LayerNorm: a float8 output target that does not fit the input " +
                c10::str(x.sizes()) + " on " + x.device().str() +
                " (q [rows, cols] float8_e4m3fn, a scalar float32 inverse and a float32 history "
                "of at least 2 entries, all on the input's device)");
}

// Forward shared by the functions: h (x itself without delta), y, mean, rstd. An undefined bias:
// RMSNorm (no mean: `mean` not written, not saved). fp8 (may be null): y written there as float8
// instead, and returned as a stand-in.
variable_list forward_kernel(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                             const at::Tensor& weight, const at::Tensor& bias, double eps,
                             at::ScalarType type, const NormFp8Target* target = nullptr) {
  const c10::cuda::CUDAGuard guard(x.device());
  const bool rms = !bias.defined();
  // Through dispatched operators (not data pointers alone), so that fsdp gathers the parameters.
  const at::Tensor w = contiguous_aligned(weight.to(at::kFloat));
  const at::Tensor b = rms ? at::Tensor() : contiguous_aligned(bias.to(at::kFloat));
  const at::Tensor x2 = contiguous_aligned(x);
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor d;
  if (delta.defined()) d = contiguous_aligned(delta.to(type));
  at::Tensor h = delta.defined() ? at::empty_like(x2) : x2;
  if (target != nullptr) check_target(*target, x);
  // fp8: the target of the output's float8 bytes; a tensorwise target takes the output's amax
  // only (the output is written as usual).
  const bool bytes = target != nullptr && target->q.defined();
  const NormFp8Target* const fp8 = bytes ? target : nullptr;
  const NormFp8Target* const amax_target = target != nullptr && !bytes ? target : nullptr;
  at::Tensor y = fp8 != nullptr ? stand_in(x.sizes(), x.options().dtype(type))
                                : at::empty(x.sizes(), x.options().dtype(type));
  kernels::LayerNormFp8Out f8;
  if (amax_target != nullptr) f8.record = amax_target->amax.data_ptr<float>();
  if (fp8 != nullptr) {
    const int len = static_cast<int>(fp8->history.size(0) - 1);
    f8.q = static_cast<uint8_t*>(fp8->q.data_ptr());
    f8.history = fp8->history.data_ptr<float>();
    f8.history_len = len;
    f8.record = fp8->record ? fp8->history.data_ptr<float>() + len : nullptr;
    f8.inverse = fp8->inverse.data_ptr<float>();
  }
  at::Tensor mean = rms ? at::Tensor() : at::empty({rows}, x.options().dtype(at::kFloat));
  at::Tensor rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  void* stream = c10::cuda::getCurrentCUDAStream(x.device().index()).stream();
  if (rms) {
    check_kernel_launch(
        kernels::rms_norm_forward(x2.data_ptr<float>(), d.defined() ? d.data_ptr() : nullptr,
                                  h.data_ptr<float>(), w.data_ptr<float>(),
                                  fp8 != nullptr ? nullptr : y.data_ptr(), rstd.data_ptr<float>(),
                                  rows, cols, static_cast<float>(eps), kind(type), stream, f8),
        "fused RMSNorm", "rms_norm_forward");
  } else {
    check_kernel_launch(
        kernels::layer_norm_forward(x2.data_ptr<float>(), d.defined() ? d.data_ptr() : nullptr,
                                    h.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(),
                                    fp8 != nullptr ? nullptr : y.data_ptr(), mean.data_ptr<float>(),
                                    rstd.data_ptr<float>(), rows, cols, static_cast<float>(eps),
                                    kind(type), stream, f8),
        "fused LayerNorm", "layer_norm_forward");
  }
  // Detached: h is an output of FusedAddLayerNorm, and an output kept in its own node's context
  // would hold that node, and with it the whole step's graph, forever (a reference cycle).
  ctx->saved_data["h"] = h.detach();
  // detach() shares h's version counter: backward_kernel refuses an h changed in place since, as
  // autograd refuses a saved tensor so changed (the kernel would read the new values silently).
  // An inference tensor (torch::InferenceMode) has no counter, and no backward: -1.
  ctx->saved_data["h_version"] =
      h.is_inference() ? int64_t{-1} : static_cast<int64_t>(h._version());
  ctx->saved_data["mean"] = mean;
  ctx->saved_data["rstd"] = rstd;
  ctx->saved_data["w"] = w;
  ctx->saved_data["type"] = static_cast<int64_t>(type);
  ctx->saved_data["w_type"] = static_cast<int64_t>(weight.scalar_type());
  ctx->saved_data["b_type"] = static_cast<int64_t>(rms ? at::kFloat : bias.scalar_type());
  ctx->saved_data["rms"] = rms;
  return {h, y};
}

// {dh, dh16 (or undefined), dweight, dbias (undefined for RMSNorm)}.
variable_list backward_kernel(AutogradContext* ctx, const at::Tensor& dh_in, const at::Tensor& dy,
                              bool want_16) {
  const at::Tensor h = ctx->saved_data["h"].toTensor();
  const bool rms = ctx->saved_data["rms"].toBool();
  const int64_t saved_version = ctx->saved_data["h_version"].toInt();
  TORCH_CHECK(saved_version < 0 || static_cast<int64_t>(h._version()) == saved_version,
              "one of the variables needed for gradient computation has been modified by an "
              "inplace operation: the tensor the fused ",
              rms ? "RMSNorm" : "LayerNorm", " normalized (", h.sizes(), ") is at version ",
              h._version(), "; expected version ", saved_version,
              " instead. Change it out of place (x = x + ...) or clone it before the change.");
  const at::Tensor mean = rms ? at::Tensor() : ctx->saved_data["mean"].toTensor();
  const at::Tensor rstd = ctx->saved_data["rstd"].toTensor();
  // Through a dispatched operator again: under fsdp the weight's unit may have been freed after
  // the forward, and an operator that takes it is what gathers it back.
  const at::Tensor w = contiguous_aligned(ctx->saved_data["w"].toTensor().to(at::kFloat));
  const auto type = static_cast<at::ScalarType>(ctx->saved_data["type"].toInt());
  const c10::cuda::CUDAGuard guard(h.device());
  const int64_t cols = h.size(-1), rows = h.numel() / cols;
  const at::Tensor g = contiguous_aligned(dy.to(type));
  const at::Tensor dh_prev =
      dh_in.defined() ? contiguous_aligned(dh_in.to(at::kFloat)) : at::Tensor();
  at::Tensor dh = at::empty_like(h);
  at::Tensor dh16 = want_16 ? at::empty(h.sizes(), h.options().dtype(type)) : at::Tensor();
  at::Tensor dw = at::empty({cols}, h.options());
  at::Tensor db = rms ? at::Tensor() : at::empty({cols}, h.options());
  at::Tensor workspace = at::empty({kernels::layer_norm_workspace_floats(rows, cols)}, h.options());
  void* stream = c10::cuda::getCurrentCUDAStream(h.device().index()).stream();
  const float* dh_prev_ptr = dh_prev.defined() ? dh_prev.data_ptr<float>() : nullptr;
  void* dh16_ptr = want_16 ? dh16.data_ptr() : nullptr;
  if (rms) {
    check_kernel_launch(
        kernels::rms_norm_backward(g.data_ptr(), h.data_ptr<float>(), rstd.data_ptr<float>(),
                                   w.data_ptr<float>(), dh_prev_ptr, dh.data_ptr<float>(), dh16_ptr,
                                   dw.data_ptr<float>(), workspace.data_ptr<float>(), rows, cols,
                                   kind(type), stream),
        "fused RMSNorm", "rms_norm_backward");
  } else {
    check_kernel_launch(
        kernels::layer_norm_backward(
            g.data_ptr(), h.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
            w.data_ptr<float>(), dh_prev_ptr, dh.data_ptr<float>(), dh16_ptr, dw.data_ptr<float>(),
            db.data_ptr<float>(), workspace.data_ptr<float>(), rows, cols, kind(type), stream),
        "fused LayerNorm", "layer_norm_backward");
  }
  const auto w_type = static_cast<at::ScalarType>(ctx->saved_data["w_type"].toInt());
  const auto b_type = static_cast<at::ScalarType>(ctx->saved_data["b_type"].toInt());
  return {dh, dh16, dw.to(w_type), rms ? at::Tensor() : db.to(b_type)};
}

struct FusedLayerNorm : torch::autograd::Function<FusedLayerNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, double eps, int64_t type) {
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    return forward_kernel(ctx, x, at::Tensor(), weight, bias, eps,
                          static_cast<at::ScalarType>(type))[1];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = backward_kernel(ctx, at::Tensor(), grads[0], false);
    const auto x_type = static_cast<at::ScalarType>(ctx->saved_data["x_type"].toInt());
    return {g[0].to(x_type), g[2], g[3], at::Tensor(), at::Tensor()};
  }
};

// {x, LayerNorm(x)}, or RMSNorm without a bias (keep_layer_norm_16, keep_rms_norm_16): x comes
// back through the node (LibTorch returns an input as a view of it with this node as its
// gradient's target), so the gradient the residual path gives it later arrives here as grads[0]
// and the backward kernel adds it (dh_prev) instead of autograd summing it with this node's in a
// pass of its own. bias: a tensor with no elements for RMSNorm.
// fp8 (may be null): y written there as float8, a stand-in returned for it.
struct FusedKeepNorm : torch::autograd::Function<FusedKeepNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, double eps, int64_t type,
                               const NormFp8Target* fp8) {
    const bool rms = bias.numel() == 0;
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    const at::Tensor y = forward_kernel(ctx, x, at::Tensor(), weight, rms ? at::Tensor() : bias,
                                        eps, static_cast<at::ScalarType>(type), fp8)[1];
    return {x, y};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor dy = grads[1];
    if (!dy.defined()) dy = at::zeros_like(ctx->saved_data["h"].toTensor(), at::kFloat);
    auto g = backward_kernel(ctx, grads[0], dy, /*want_16=*/false);
    const auto x_type = static_cast<at::ScalarType>(ctx->saved_data["x_type"].toInt());
    const bool rms = ctx->saved_data["rms"].toBool();
    return {g[0].to(x_type), g[2],         rms ? at::Tensor() : g[3],
            at::Tensor(),    at::Tensor(), at::Tensor()};
  }
};

// fp8 (may be null): as FusedKeepNorm's.
struct FusedAddLayerNorm : torch::autograd::Function<FusedAddLayerNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, const at::Tensor& bias, double eps,
                               int64_t type, const NormFp8Target* fp8) {
    return forward_kernel(ctx, x, delta, weight, bias, eps, static_cast<at::ScalarType>(type), fp8);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor dy = grads[1];
    if (!dy.defined()) dy = at::zeros_like(ctx->saved_data["h"].toTensor(), at::kFloat);
    auto g = backward_kernel(ctx, grads[0], dy, /*want_16=*/true);  // delta is 16-bit
    return {g[0], g[1], g[2], g[3], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The RMSNorm forms: no bias input (an undefined tensor cannot be an autograd input).
struct FusedRmsNorm : torch::autograd::Function<FusedRmsNorm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            double eps, int64_t type) {
    ctx->saved_data["x_type"] = static_cast<int64_t>(x.scalar_type());
    return forward_kernel(ctx, x, at::Tensor(), weight, at::Tensor(), eps,
                          static_cast<at::ScalarType>(type))[1];
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto g = backward_kernel(ctx, at::Tensor(), grads[0], false);
    const auto x_type = static_cast<at::ScalarType>(ctx->saved_data["x_type"].toInt());
    return {g[0].to(x_type), g[2], at::Tensor(), at::Tensor()};
  }
};

// fp8 (may be null): as FusedKeepNorm's.
struct FusedAddRmsNorm : torch::autograd::Function<FusedAddRmsNorm> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& delta,
                               const at::Tensor& weight, double eps, int64_t type,
                               const NormFp8Target* fp8) {
    return forward_kernel(ctx, x, delta, weight, at::Tensor(), eps,
                          static_cast<at::ScalarType>(type), fp8);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor dy = grads[1];
    if (!dy.defined()) dy = at::zeros_like(ctx->saved_data["h"].toTensor(), at::kFloat);
    auto g = backward_kernel(ctx, grads[0], dy, /*want_16=*/true);
    return {g[0], g[1], g[2], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor norm_16(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                   double eps) {
  const auto type = static_cast<int64_t>(autocast_16(x));
  return bias.defined() ? FusedLayerNorm::apply(x, weight, bias, eps, type)
                        : FusedRmsNorm::apply(x, weight, eps, type);
}

std::pair<at::Tensor, at::Tensor> keep_norm(const at::Tensor& x, const at::Tensor& weight,
                                            const at::Tensor& bias, double eps,
                                            const NormFp8Target* target) {
  auto out =
      FusedKeepNorm::apply(x, weight, bias.defined() ? bias : at::empty({0}, weight.options()), eps,
                           static_cast<int64_t>(autocast_16(x)), target);
  return {out[0], out[1]};
}

std::pair<at::Tensor, at::Tensor> add_norm(const at::Tensor& x, const at::Tensor& delta,
                                           const at::Tensor& weight, const at::Tensor& bias,
                                           double eps, const NormFp8Target* target) {
  const auto type = static_cast<int64_t>(autocast_16(x));
  auto out = bias.defined() ? FusedAddLayerNorm::apply(x, delta, weight, bias, eps, type, target)
                            : FusedAddRmsNorm::apply(x, delta, weight, eps, type, target);
  return {out[0], out[1]};
}
#endif

}  // namespace fabric::models::detail
