// fabric::Precision: the numerics of training, chosen by `fabric.precision`:
//   32-true    float32 weights and math (default)
//   64-true    float64 weights and math
//   16-mixed   float32 weights, float16 autocast, loss scaling (GradScaler)
//   bf16-mixed float32 weights, bfloat16 autocast (no scaling needed)
//   16-true    float16 weights and math (CUDA only)
//   bf16-true  bfloat16 weights and math
// It converts modules and floating inputs for *-true/64-true, provides the autocast region for
// *-mixed, scales the loss in backward() and wraps the optimizer step (unscale, inf check, skip,
// scale update) for 16-mixed.
#ifndef FABRIC_PRECISION_PRECISION_H_
#define FABRIC_PRECISION_PRECISION_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/precision/autocast.h"
#include "fabric/precision/grad_scaler.h"

namespace fabric {

enum class PrecisionMode {
  k32True,
  k64True,
  k16Mixed,
  kBf16Mixed,
  k16True,
  kBf16True,
  // bf16-mixed, and the fabric::nn::Linear layers' GEMMs in float8 (fabric/nn/fp8.h).
  kFp8Mixed
};

// "16-mixed" → k16Mixed. Accepts canonical names only (aliases are resolved by the config).
// Throws fabric::Error for unknown names.
PrecisionMode parse_precision(const std::string& name);
std::string to_string(PrecisionMode mode);

class Precision {
 public:
  // `device_type` is where the model runs (autocast device). `scaler` applies to 16-mixed only.
  Precision(PrecisionMode mode, c10::DeviceType device_type, GradScalerOptions scaler = {});

  PrecisionMode mode() const { return mode_; }
  bool is_mixed() const;
  // dtype of parameters after convert_module (float32 for 32-true and *-mixed).
  c10::ScalarType param_dtype() const;
  // float16/bfloat16 for *-mixed.
  std::optional<c10::ScalarType> autocast_dtype() const;

  // Autocast region for *-mixed; a no-op guard otherwise.
  AutocastGuard autocast() const;
  // Casts parameters and buffers to param_dtype() (no-op for 32-true and *-mixed). (fp8-mixed's
  // float8 GEMMs are turned on by the strategy, Strategy::convert_module: this package knows no
  // layers.)
  void convert_module(torch::nn::Module& module) const;
  // fabric.fp8.exclude_modules: module-name patterns that stay in bf16 under fp8-mixed.
  void set_fp8_exclude(std::vector<std::string> patterns) { fp8_exclude_ = std::move(patterns); }
  const std::vector<std::string>& fp8_exclude() const { return fp8_exclude_; }
  // fabric.fp8.recipe: rowwise (a scale per row of each GEMM operand) instead of tensorwise.
  void set_fp8_rowwise(bool on) { fp8_rowwise_ = on; }
  bool fp8_rowwise() const { return fp8_rowwise_; }
  // fabric.fp8.recipe: delayed: the steps of amax history each scale comes from (0: dynamic).
  void set_fp8_amax_history(int64_t steps) { fp8_amax_history_ = steps; }
  int64_t fp8_amax_history() const { return fp8_amax_history_; }
  // fabric.fp8.fast_accumulation (fabric/nn/fp8.h's fp8_linear).
  void set_fp8_fast_accumulation(bool on) { fp8_fast_accumulation_ = on; }
  bool fp8_fast_accumulation() const { return fp8_fast_accumulation_; }
  // fabric.fp8.grad_margin (delayed: fabric/nn/fp8.h's Fp8History::grad_margin).
  void set_fp8_grad_margin(int64_t margin) { fp8_grad_margin_ = margin; }
  int64_t fp8_grad_margin() const { return fp8_grad_margin_; }
  // Casts a floating tensor to param_dtype() for *-true/64-true; other tensors pass unchanged.
  torch::Tensor convert_input(const torch::Tensor& tensor) const;

  // loss.backward(), with loss scaling under 16-mixed.
  void backward(const torch::Tensor& loss);
  // Unscales `optimizer`'s gradients now (before clipping); at most once per step.
  void unscale_gradients(torch::optim::Optimizer& optimizer);
  // Optimizer step; under 16-mixed: unscale if needed, skip on inf/NaN, update the scale.
  // Returns whether the optimizer stepped.
  bool optimizer_step(torch::optim::Optimizer& optimizer);

  // The loss scaler under 16-mixed, else nullptr.
  GradScaler* scaler() { return scaler_.get(); }
  const GradScaler* scaler() const { return scaler_.get(); }

 private:
  PrecisionMode mode_;
  c10::DeviceType device_type_;
  std::unique_ptr<GradScaler> scaler_;
  std::vector<std::string> fp8_exclude_;
  bool fp8_rowwise_ = false;
  int64_t fp8_amax_history_ = 0;
  bool fp8_fast_accumulation_ = true;
  int64_t fp8_grad_margin_ = 3;
};

}  // namespace fabric

#endif  // FABRIC_PRECISION_PRECISION_H_
