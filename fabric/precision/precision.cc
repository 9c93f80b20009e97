#include "fabric/precision/precision.h"

#include <torch/types.h>

#include "fabric/core/error.h"

namespace fabric {

namespace {
constexpr std::pair<PrecisionMode, const char*> kNames[] = {
    {PrecisionMode::k32True, "32-true"},     {PrecisionMode::k64True, "64-true"},
    {PrecisionMode::k16Mixed, "16-mixed"},   {PrecisionMode::kBf16Mixed, "bf16-mixed"},
    {PrecisionMode::k16True, "16-true"},     {PrecisionMode::kBf16True, "bf16-true"},
    {PrecisionMode::kFp8Mixed, "fp8-mixed"},
};
}  // namespace

PrecisionMode parse_precision(const std::string& name) {
  for (const auto& [mode, text] : kNames)
    if (name == text) return mode;
  throw Error("unknown precision '" + name + "'");
}

std::string to_string(PrecisionMode mode) {
  for (const auto& [m, text] : kNames)
    if (m == mode) return text;
  return "?";
}

Precision::Precision(PrecisionMode mode, c10::DeviceType device_type, GradScalerOptions scaler)
    : mode_(mode), device_type_(device_type) {
  if (mode_ == PrecisionMode::k16Mixed) scaler_ = std::make_unique<GradScaler>(scaler);
}

bool Precision::is_mixed() const {
  return mode_ == PrecisionMode::k16Mixed || mode_ == PrecisionMode::kBf16Mixed ||
         mode_ == PrecisionMode::kFp8Mixed;
}

c10::ScalarType Precision::param_dtype() const {
  switch (mode_) {
    case PrecisionMode::k64True:
      return c10::kDouble;
    case PrecisionMode::k16True:
      return c10::kHalf;
    case PrecisionMode::kBf16True:
      return c10::kBFloat16;
    default:
      return c10::kFloat;
  }
}

std::optional<c10::ScalarType> Precision::autocast_dtype() const {
  if (mode_ == PrecisionMode::k16Mixed) return c10::kHalf;
  if (mode_ == PrecisionMode::kBf16Mixed || mode_ == PrecisionMode::kFp8Mixed)
    return c10::kBFloat16;
  return std::nullopt;
}

AutocastGuard Precision::autocast() const {
  if (auto dtype = autocast_dtype()) return AutocastGuard(device_type_, *dtype);
  return AutocastGuard();
}

void Precision::convert_module(torch::nn::Module& module) const {
  if (param_dtype() == c10::kFloat) return;
  // Module::to(dtype) would also cast integer buffers (BatchNorm's num_batches_tracked); like
  // Python's module.to(dtype), convert floating-point tensors only.
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters())
    if (p.is_floating_point()) p.set_data(p.to(param_dtype()));
  for (auto& b : module.buffers())
    if (b.is_floating_point()) b.set_data(b.to(param_dtype()));
}

torch::Tensor Precision::convert_input(const torch::Tensor& tensor) const {
  if (!tensor.defined() || !tensor.is_floating_point() || param_dtype() == c10::kFloat ||
      tensor.scalar_type() == param_dtype()) {
    return tensor;
  }
  return tensor.to(param_dtype());
}

void Precision::backward(const torch::Tensor& loss) {
  if (scaler_) {
    scaler_->scale(loss).backward();
  } else {
    loss.backward();
  }
}

void Precision::unscale_gradients(torch::optim::Optimizer& optimizer) {
  if (scaler_) scaler_->unscale_(optimizer);
}

bool Precision::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (!scaler_) {
    optimizer.step();
    return true;
  }
  const bool stepped = scaler_->step(optimizer);
  scaler_->update();
  return stepped;
}

}  // namespace fabric
