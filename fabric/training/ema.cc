#include "fabric/training/ema.h"

#include <ATen/ops/_foreach_lerp.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <utility>

#include "fabric/core/error.h"

namespace fabric {

ExponentialMovingAverage::ExponentialMovingAverage(torch::nn::Module& module, double decay,
                                                   bool warmup)
    : decay_(decay), warmup_(warmup) {
  if (!(decay >= 0 && decay < 1)) {
    throw Error("trainer.ema_decay: " + std::to_string(decay) + " is not in [0, 1)");
  }
  c10::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().is_floating_point()) continue;
    names_.push_back(item.key());
    params_.push_back(item.value().detach());  // shares the parameter's storage
    averages_.push_back(item.value().detach().clone());
  }
}

double ExponentialMovingAverage::next_decay() const {
  if (!warmup_) return decay_;
  const double n = static_cast<double>(updates_ + 1);
  return std::min(decay_, (1.0 + n) / (10.0 + n));
}

void ExponentialMovingAverage::update() {
  if (swapped_) throw Error("ExponentialMovingAverage::update inside swap_into_model()");
  c10::NoGradGuard no_grad;
  if (!params_.empty()) {
    at::_foreach_lerp_(averages_, params_, 1.0 - next_decay());
  }
  ++updates_;
}

ScopeGuard ExponentialMovingAverage::swap_into_model() {
  if (swapped_) throw Error("ExponentialMovingAverage::swap_into_model is not nestable");
  auto swap = [this] {
    c10::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      torch::Tensor live = params_[i].clone();
      params_[i].copy_(averages_[i]);
      averages_[i] = std::move(live);
    }
  };
  swap();
  swapped_ = true;
  return ScopeGuard([this, swap] {
    swap();
    swapped_ = false;
  });
}

void ExponentialMovingAverage::add_to(CheckpointState& state, const std::string& prefix) {
  for (size_t i = 0; i < names_.size(); ++i) state.add(prefix + "." + names_[i], averages_[i]);
  state.add(prefix + ".updates", updates_);
}

}  // namespace fabric
