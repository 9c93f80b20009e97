#include "fabric/training/ema.h"

#include <ATen/ops/_foreach_lerp.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <utility>

#include "fabric/core/error.h"

namespace fabric {
namespace {

ParameterParts whole_parameters(torch::nn::Module& module) {
  ParameterParts out;
  for (const auto& item : module.named_parameters())
    if (item.value().is_floating_point())
      out.parts.push_back(
          {item.key(), item.value().detach(), item.value().sizes().vec(), 0, false});
  return out;
}

// A parameter fsdp shards keeps its shape over a storage whose memory is freed.
void check_has_memory(const ParameterPart& part) {
  const torch::Tensor& p = part.values;
  const int64_t needed = (p.storage_offset() + p.numel()) * p.element_size();
  if (p.numel() > 0 && static_cast<int64_t>(p.storage().nbytes()) < needed) {
    throw Error("ExponentialMovingAverage: parameter " + part.name +
                " holds no memory of its own (its strategy shards it, as fsdp does); "
                "construct the average from f.parameter_parts(model) of the model set up");
  }
}

}  // namespace

ExponentialMovingAverage::ExponentialMovingAverage(torch::nn::Module& module, double decay,
                                                   bool warmup)
    : ExponentialMovingAverage(whole_parameters(module), decay, warmup) {}

ExponentialMovingAverage::ExponentialMovingAverage(ParameterParts parts, double decay, bool warmup)
    : decay_(decay), warmup_(warmup), parts_(std::move(parts)) {
  if (!(decay >= 0 && decay < 1)) {
    throw Error("trainer.ema_decay: " + std::to_string(decay) + " is not in [0, 1)");
  }
  c10::NoGradGuard no_grad;
  for (size_t i = 0; i < parts_.parts.size(); ++i) {
    check_has_memory(parts_.parts[i]);
    const torch::Tensor& values = parts_.parts[i].values;
    averages_.push_back(values.detach().clone());
    if (values.numel() == 0) continue;
    live_.push_back(values);  // shares the parameter's storage
    live_index_.push_back(i);
  }
}

std::vector<torch::Tensor> ExponentialMovingAverage::live_averages() const {
  // Looked up each time: loading a checkpoint may replace an average tensor.
  std::vector<torch::Tensor> out;
  out.reserve(live_index_.size());
  for (size_t i : live_index_) out.push_back(averages_[i]);
  return out;
}

double ExponentialMovingAverage::next_decay() const {
  if (!warmup_) return decay_;
  const double n = static_cast<double>(updates_ + 1);
  return std::min(decay_, (1.0 + n) / (10.0 + n));
}

void ExponentialMovingAverage::update() {
  if (swapped_) throw Error("ExponentialMovingAverage::update inside swap_into_model()");
  c10::NoGradGuard no_grad;
  if (!live_.empty()) at::_foreach_lerp_(live_averages(), live_, 1.0 - next_decay());
  ++updates_;
}

ScopeGuard ExponentialMovingAverage::swap_into_model() {
  if (swapped_) throw Error("ExponentialMovingAverage::swap_into_model is not nestable");
  auto swap = [this] {
    c10::NoGradGuard no_grad;
    const std::vector<torch::Tensor> averages = live_averages();
    for (size_t i = 0; i < live_.size(); ++i) {
      const torch::Tensor held = live_[i].clone();
      live_[i].copy_(averages[i]);
      averages[i].copy_(held);
    }
    if (parts_.changed) parts_.changed();
  };
  swap();
  swapped_ = true;
  return ScopeGuard([this, swap] {
    swap();
    swapped_ = false;
  });
}

void ExponentialMovingAverage::add_to(CheckpointState& state, const std::string& prefix) {
  for (size_t i = 0; i < parts_.parts.size(); ++i) {
    const ParameterPart& part = parts_.parts[i];
    const std::string name = prefix + "." + part.name;
    if (!part.split) {
      state.add(name, averages_[i]);
      continue;
    }
    state.add_split(
        name, averages_[i], part.sizes, part.offset,
        [this, i] { return parts_.gather(averages_[i], i); }, part.layout, part.written);
  }
  state.add(prefix + ".updates", updates_);
}

}  // namespace fabric
