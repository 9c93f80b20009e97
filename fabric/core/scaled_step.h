// fabric::ScaledStep: the interface through which fabric::GradScaler hands its loss scale and
// found-inf flag to an optimizer whose kernels take them on the device (the fused SGD, Adam and
// AdamW of fabric/training/fast_optimizers.h), so that a 16-mixed step needs no host
// synchronization: the kernels unscale the gradients while updating and leave the parameters and
// state untouched where found_inf != 0.
#ifndef FABRIC_CORE_SCALED_STEP_H_
#define FABRIC_CORE_SCALED_STEP_H_

#include <ATen/core/Tensor.h>

namespace fabric {

class ScaledStep {
 public:
  virtual ~ScaledStep() = default;

  // Whether step_scaled() may be used (the fused implementation is in use).
  virtual bool takes_grad_scale() const = 0;

  // One step of every parameter group. `grad_scale` (1 float32 element, or undefined when the
  // gradients are already unscaled) divides every gradient inside the update; `found_inf`
  // (1 float32 element, on the parameters' device) nonzero skips the update entirely.
  virtual void step_scaled(const at::Tensor& grad_scale, const at::Tensor& found_inf) = 0;

  // Writes counters kept on the device (Adam's step counts while skipped steps are pending) into
  // the torch::optim state, so that state() reads true values; may synchronize with the device.
  // Called before a checkpoint reads the state.
  virtual void sync_state() = 0;

  // Forgets device-side counters after the state was replaced (a checkpoint was loaded).
  virtual void state_loaded() = 0;

  // For steps captured in a CUDA graph (fabric/graphed_step.h). With device_lr on, the
  // update reads each group's learning rate from a float32 scalar on the parameters' device, which
  // refresh_lr() fills from the group's options (outside the graph, before every step), so a
  // replayed step follows the LR schedule. Off by default.
  virtual void set_device_lr(bool on) = 0;
  virtual void refresh_lr() = 0;
  // Steps ran without their host-side bookkeeping (graph replays): counters kept on the device
  // are the true ones until sync_state().
  virtual void steps_ran_on_device() = 0;
};

}  // namespace fabric

#endif  // FABRIC_CORE_SCALED_STEP_H_
