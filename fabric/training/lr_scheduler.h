// Learning-rate schedules LibTorch lacks, as a function of the optimizer step (0-based). They
// depend on the step count only, never on the world size: the same config gives the same
// schedule on 1 or N processes.
//
//   constant    base_lr (after the warm-up, if any); `none` is the same
//   step        base_lr · gamma^floor(step / step_size)  (torch.optim.lr_scheduler.StepLR)
//   multistep   base_lr · gamma^(milestones passed)      (MultiStepLR; a milestone m means the rate
//               changes before optimizer step m)
//   cosine      linear warm-up to base_lr over warmup_steps, then cosine to min_lr at total_steps
//   linear      linear warm-up, then linear decay to min_lr at total_steps
//   one_cycle   torch.optim.lr_scheduler.OneCycleLR (cosine annealing, two phases): from
//               max_lr/div_factor up to max_lr at pct_start·total, then down to
//               max_lr/div_factor/final_div_factor at the last step
//
// step and multistep count from step 0 as PyTorch's do; with warmup_steps the first steps ramp
// linearly to the rate the schedule has there.
//
// Example:
//   fabric::LRScheduler scheduler(optimizer, fabric::LRSchedule::from_config(config, total_steps));
//   for (...) { ...; f.step(optimizer); scheduler.step(); }
#ifndef FABRIC_TRAINING_LR_SCHEDULER_H_
#define FABRIC_TRAINING_LR_SCHEDULER_H_

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fabric/config/config.h"

namespace fabric {

class LRSchedule {
 public:
  static LRSchedule constant(double base_lr, int64_t warmup_steps = 0);
  static LRSchedule cosine(double base_lr, int64_t total_steps, int64_t warmup_steps = 0,
                           double min_lr = 0.0);
  static LRSchedule linear(double base_lr, int64_t total_steps, int64_t warmup_steps = 0,
                           double min_lr = 0.0);
  static LRSchedule one_cycle(double max_lr, int64_t total_steps, double pct_start = 0.3,
                              double div_factor = 25.0, double final_div_factor = 1e4);
  // REQUIRES: step_size >= 1, gamma > 0.
  static LRSchedule step(double base_lr, int64_t step_size, double gamma = 0.1,
                         int64_t warmup_steps = 0);
  // Throws fabric::Error unless the milestones are non-negative and strictly increasing.
  static LRSchedule multistep(double base_lr, std::vector<int64_t> milestones, double gamma = 0.1,
                              int64_t warmup_steps = 0);
  // From the `scheduler:` section with base/max lr = optimizer.lr. REQUIRES: total_steps ≥ 1.
  static LRSchedule from_config(const Config& config, int64_t total_steps);

  // Learning rate for optimizer step `step` (clamped to the last step beyond total_steps).
  double lr_at(int64_t step) const;
  const std::string& name() const { return name_; }

 private:
  LRSchedule() = default;
  double decayed_at(int64_t step) const;  // step, multistep: without the warm-up
  std::string name_;
  double base_ = 0, min_ = 0, pct_start_ = 0.3, div_ = 25, final_div_ = 1e4;
  int64_t total_ = 1, warmup_ = 0;
  int64_t step_size_ = 1;
  double gamma_ = 0.1;
  std::vector<int64_t> milestones_;
};

// Applies a schedule to every parameter group of an optimizer: the constructor sets the rate of
// step 0; step() (after each optimizer step) advances it.
class LRScheduler {
 public:
  LRScheduler(torch::optim::Optimizer& optimizer, LRSchedule schedule);
  void step();
  // Jumps to `step` (resume).
  void set_step(int64_t step);
  int64_t current_step() const { return step_; }
  double get_lr() const { return schedule_.lr_at(step_); }

 private:
  void apply();
  torch::optim::Optimizer& optimizer_;
  LRSchedule schedule_;
  int64_t step_ = 0;
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_LR_SCHEDULER_H_
