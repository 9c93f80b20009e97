// fabric::SGD, fabric::Adam, fabric::AdamW: torch::optim's optimizers with a faster step.
//
// Same options, the same per-parameter state (torch::optim::SGDParamState / AdamParamState /
// AdamWParamState, so checkpoints, torch::save/load and LR schedules work unchanged) and the same
// update rule; step() updates all parameters of a device and dtype at once instead of one at a
// time:
//   kFused     at::_fused_sgd_ / _fused_adam_ / _fused_adamw_ (CPU and CUDA kernels): one pass
//              over each tensor; under 16-mixed they also take fabric::GradScaler's scale and
//              found-inf flag on the device (fabric/core/scaled_step.h), so an AMP step is
//              designed to need no host synchronization (unverified on a GPU).
//   kForeach   at::_foreach_* ops (a few multi-tensor kernels per step).
//   kForLoop   torch::optim's own per-parameter loop (the reference).
//   kAuto      kFused (the default; measured fastest on CPU with one thread, docs/benchmarks.md;
//              CUDA not measured).
// Results match torch::optim within floating-point rounding (tests/training/fast_optimizers_test).
// Not supported by kFused/kForeach: sparse or complex gradients (step() throws fabric::Error);
// use kForLoop.
//
// With kFused, Adam(W)'s step counts also live on the device while 16-mixed steps may be skipped
// there; sync_state() (called by Fabric's checkpointing and by save()) writes them back; after
// replacing the state by other means than Fabric::load or torch::load, call state_loaded().
//
// Example:
//   fabric::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
//   f.setup(model, optimizer);  ... f.step(optimizer);
#ifndef FABRIC_TRAINING_FAST_OPTIMIZERS_H_
#define FABRIC_TRAINING_FAST_OPTIMIZERS_H_

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fabric/core/scaled_step.h"

namespace fabric {

enum class OptimizerImpl { kAuto, kFused, kForeach, kForLoop };

namespace internal {

// ScaledStep's device learning rates: one float32 scalar per (parameter group, device).
class DeviceLr {
 public:
  bool on = false;
  // The tensor for group `group` on `device`, made (holding `lr`) on first use.
  const at::Tensor& get(size_t group, const torch::Device& device, double lr);
  // Fills every tensor made so far with its group's current learning rate.
  void refresh(const std::vector<torch::optim::OptimizerParamGroup>& groups);

 private:
  std::map<std::pair<size_t, std::string>, at::Tensor> tensors_;
};

}  // namespace internal

// "auto" | "fused" | "foreach" | "for_loop" (the optimizer.implementation config key).
OptimizerImpl parse_optimizer_impl(const std::string& name);  // throws fabric::Error
std::string optimizer_impl_name(OptimizerImpl impl);

class SGD : public torch::optim::SGD, public ScaledStep {
 public:
  SGD(const std::vector<torch::Tensor>& params, const torch::optim::SGDOptions& options,
      OptimizerImpl impl = OptimizerImpl::kAuto);
  SGD(const std::vector<torch::optim::OptimizerParamGroup>& groups,
      const torch::optim::SGDOptions& options, OptimizerImpl impl = OptimizerImpl::kAuto);

  torch::Tensor step(LossClosure closure = nullptr) override;
  OptimizerImpl implementation() const { return impl_; }

  bool takes_grad_scale() const override { return impl_ == OptimizerImpl::kFused; }
  void step_scaled(const at::Tensor& grad_scale, const at::Tensor& found_inf) override;
  void sync_state() override {}
  void state_loaded() override {}
  void set_device_lr(bool on) override { device_lr_.on = on; }
  void refresh_lr() override { device_lr_.refresh(param_groups()); }
  void steps_ran_on_device() override {}

 private:
  void update(const at::Tensor& grad_scale, const at::Tensor& found_inf);
  OptimizerImpl impl_;
  internal::DeviceLr device_lr_;
};

namespace internal {

// Adam and AdamW share everything but the weight decay (L2 in the gradient vs decoupled).
template <typename Base, typename Options, typename State>
class AdamFamily : public Base, public ScaledStep {
 public:
  using LossClosure = typename Base::LossClosure;
  AdamFamily(const std::vector<torch::Tensor>& params, const Options& options,
             OptimizerImpl impl = OptimizerImpl::kAuto);
  AdamFamily(const std::vector<torch::optim::OptimizerParamGroup>& groups, const Options& options,
             OptimizerImpl impl = OptimizerImpl::kAuto);

  torch::Tensor step(LossClosure closure = nullptr) override;
  OptimizerImpl implementation() const { return impl_; }

  bool takes_grad_scale() const override { return impl_ == OptimizerImpl::kFused; }
  void step_scaled(const at::Tensor& grad_scale, const at::Tensor& found_inf) override;
  void sync_state() override;
  void state_loaded() override;
  void set_device_lr(bool on) override { device_lr_.on = on; }
  void refresh_lr() override { device_lr_.refresh(this->param_groups()); }
  void steps_ran_on_device() override { host_stale_ = true; }

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  void update(const at::Tensor& grad_scale, const at::Tensor& found_inf);
  OptimizerImpl impl_;
  // kFused: each parameter's step count (float32 scalar on its device), authoritative while
  // host_stale_ (a step whose skip was decided on the device happened since the last sync).
  std::unordered_map<const void*, at::Tensor> device_steps_;
  bool host_stale_ = false;
  DeviceLr device_lr_;
};

}  // namespace internal

using Adam = internal::AdamFamily<torch::optim::Adam, torch::optim::AdamOptions,
                                  torch::optim::AdamParamState>;
using AdamW = internal::AdamFamily<torch::optim::AdamW, torch::optim::AdamWOptions,
                                   torch::optim::AdamWParamState>;

}  // namespace fabric

#endif  // FABRIC_TRAINING_FAST_OPTIMIZERS_H_
