// fabric::GradScaler: dynamic loss scaling for 16-mixed training, the C++ counterpart of
// torch.amp.GradScaler (LibTorch has none), built on at::_amp_foreach_non_finite_check_and_unscale_
// and at::_amp_update_scale_. Works on CPU and CUDA tensors.
//
// Per iteration, per optimizer: scale(loss).backward(); [unscale_(opt); clip ...]; step(opt);
// then update() once. step() unscales unless unscale_() already did (never twice), and skips
// optimizer.step() when any gradient is inf/NaN; update() then multiplies the scale by
// backoff_factor, or by growth_factor after growth_interval finite steps in a row.
//
// Not thread-safe: one scaler per training loop.
//
// Example:
//   fabric::GradScaler scaler;
//   scaler.scale(loss).backward();
//   scaler.step(optimizer);
//   scaler.update();
#ifndef FABRIC_PRECISION_GRAD_SCALER_H_
#define FABRIC_PRECISION_GRAD_SCALER_H_

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fabric/core/arg.h"
#include "fabric/core/stateful.h"

namespace fabric {

// Example: GradScalerOptions().init_scale(1024).growth_interval(100).
struct GradScalerOptions {
  FABRIC_ARG(double, init_scale) = 65536.0;     // Default: 2^16.
  FABRIC_ARG(double, growth_factor) = 2.0;      // Default: 2.0 (> 1).
  FABRIC_ARG(double, backoff_factor) = 0.5;     // Default: 0.5 (in (0, 1)).
  FABRIC_ARG(int64_t, growth_interval) = 2000;  // Default: 2000 finite steps before growing.
  // Default: true. Disabled: scale() is the identity, step() steps.
  FABRIC_ARG(bool, enabled) = true;
};

class GradScaler : public Stateful {
 public:
  // Throws fabric::Error for out-of-range options.
  explicit GradScaler(GradScalerOptions options = {});

  // loss * scale (the scale lives on the loss's device from the first call on).
  torch::Tensor scale(const torch::Tensor& loss);

  // Divides the gradients of `optimizer`'s parameters by the scale, in place, and records whether
  // any is inf/NaN. REQUIRES: not yet called for this optimizer since the last update() (throws
  // fabric::Error otherwise). Half-precision gradients are refused (unscaling them loses range).
  void unscale_(torch::optim::Optimizer& optimizer);

  // Unscales (if unscale_ was not called), then runs optimizer.step() unless a non-finite gradient
  // was found. Returns whether the optimizer stepped. REQUIRES: scale() was called this iteration.
  // An optimizer that takes the scale on the device (fabric::ScaledStep with the fused
  // implementation, fabric/training/fast_optimizers.h) gets the scale and the found-inf flag
  // instead: its kernels unscale and skip, nothing waits for the device, and step() returns true
  // (skipped_steps() still counts the skipped ones).
  bool step(torch::optim::Optimizer& optimizer);

  // Adjusts the scale from this iteration's inf checks. REQUIRES: step() ran for at least one
  // optimizer since the last update().
  void update();

  double get_scale() const;  // Current scale (host sync when it lives on a GPU).
  int64_t growth_tracker() const;
  bool is_enabled() const { return options_.enabled(); }
  const GradScalerOptions& options() const { return options_; }
  // Number of optimizer steps skipped because of inf/NaN gradients since construction
  // (synchronizes with the device when fused optimizers decided there).
  int64_t skipped_steps() const;

  // {scale, growth_factor, backoff_factor, growth_interval, growth_tracker}; integers are exact.
  std::map<std::string, double> state_dict() const;
  // Restores a state_dict(); throws fabric::Error naming missing or unexpected keys.
  void load_state_dict(const std::map<std::string, double>& state);
  // Stateful (a checkpoint entry): the state_dict() as a dictionary; restoring checks its keys
  // and types first.
  c10::IValue save_state() const override;
  std::function<void()> prepare_restore(const c10::IValue& saved,
                                        const std::string& source) override;

  // For strategies whose ranks each hold a part of the gradients
  // (fabric.ddp.shard_optimizer_state): `agree` makes this rank's found-inf flag (float32, 1
  // element, 0 or 1) the maximum over the ranks, in place, so that every rank skips the same steps.
  // From then on every unscale and step is collective.
  void set_found_inf_agreement(std::function<void(torch::Tensor&)> agree) {
    agree_ = std::move(agree);
  }

  // One flag on `device` from per-device found-inf flags (each 0 or 1): their maximum, never
  // their sum, because the fused optimizer kernels skip a step only where the flag is exactly 1.
  static torch::Tensor combine_found_inf(const std::vector<torch::Tensor>& flags,
                                         const torch::Device& device);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    std::vector<torch::Tensor> found_inf;  // one float tensor per device of the gradients
  };

  void lazy_init(const torch::Device& device);
  // Finds inf/NaN in the gradients of `optimizer` into state.found_inf (one flag per device),
  // multiplying them by `inv_scale` on the way (1: check only).
  void check_gradients(torch::optim::Optimizer& optimizer, PerOptimizer& state,
                       const torch::Tensor& inv_scale);

  GradScalerOptions options_;
  torch::Tensor scale_;           // float32, 1 element
  torch::Tensor growth_tracker_;  // int32, 1 element
  torch::Tensor unit_;            // float32 1, beside scale_: the inv_scale of a check-only pass
  std::map<const torch::optim::Optimizer*, PerOptimizer> per_optimizer_;
  int64_t skipped_steps_ = 0;
  torch::Tensor skipped_on_device_;
  std::function<void(torch::Tensor&)>
      agree_;  // int64, 1 element: steps skipped by fused optimizers
};

}  // namespace fabric

#endif  // FABRIC_PRECISION_GRAD_SCALER_H_
