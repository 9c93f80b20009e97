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
//   plateau     torch.optim.lr_scheduler.ReduceLROnPlateau (threshold_mode rel): base_lr until a
//               monitored metric, reported with LRScheduler::report() after each evaluation, has
//               not improved by the relative threshold for more than `patience` reports; then the
//               rate is multiplied by factor (not below min_lr), followed by `cooldown` reports
//               during which nothing is counted
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
#include "fabric/core/stateful.h"

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
  // REQUIRES: 0 < factor < 1, patience >= 0, threshold >= 0, cooldown >= 0. `maximize`: the
  // metric is better when larger (an accuracy) rather than smaller (a loss).
  static LRSchedule plateau(double base_lr, bool maximize, double factor = 0.1,
                            int64_t patience = 10, double threshold = 1e-4, int64_t cooldown = 0,
                            double min_lr = 0.0, int64_t warmup_steps = 0);
  // From the `scheduler:` section with base/max lr = optimizer.lr. REQUIRES: total_steps ≥ 1.
  static LRSchedule from_config(const Config& config, int64_t total_steps);

  // Learning rate for optimizer step `step` (clamped to the last step beyond total_steps); for
  // plateau, before any reduction.
  double lr_at(int64_t step) const;
  const std::string& name() const { return name_; }
  double base_lr() const { return base_; }

 private:
  LRSchedule() = default;
  double decayed_at(int64_t step) const;  // step, multistep: without the warm-up
  std::string name_;
  double base_ = 0, min_ = 0, pct_start_ = 0.3, div_ = 25, final_div_ = 1e4;
  int64_t total_ = 1, warmup_ = 0;
  int64_t step_size_ = 1;
  double gamma_ = 0.1;
  std::vector<int64_t> milestones_;
  friend class LRScheduler;  // plateau's parameters
  bool maximize_ = false;
  int64_t patience_ = 10, cooldown_ = 0;
  double threshold_ = 1e-4;
};

// Applies a schedule to every parameter group of an optimizer: the constructor sets the rate of
// step 0; step() (after each optimizer step) advances it.
//
// Parameter groups keep their ratios: a group whose rate is r when the scheduler is made learns at
// r / schedule.base_lr() times the schedule's rate (groups from optimizer.lr_scale, made by
// fabric::make_optimizer with the schedule's base rate, keep their factors). Make the scheduler
// right after the optimizer, before a checkpoint is loaded; the ratios are saved with its state,
// so a resumed run uses the saved ones.
class LRScheduler : public Stateful {
 public:
  LRScheduler(torch::optim::Optimizer& optimizer, LRSchedule schedule);
  void step();
  // Jumps to `step` (resume).
  void set_step(int64_t step);
  int64_t current_step() const { return step_; }
  // The schedule's rate now (that of a group with ratio 1), plateau reductions included.
  double get_lr() const { return schedule_.lr_at(step_) * state_.lr_factor; }

  // A metric measured after an evaluation, the same value on every rank (e.g. an all-reduced
  // accuracy). The plateau schedule decides on it; the others ignore it. NaN counts as no
  // improvement.
  void report(double metric);

  // Everything a resume needs (a checkpoint entry saves and restores it: Stateful below).
  struct State {
    int64_t step = 0;
    std::vector<double> group_scales;  // per parameter group
    double lr_factor = 1.0;            // plateau: product of the reductions (min_lr included)
    double best = 0.0;                 // plateau: best metric reported so far
    bool has_best = false;             // plateau: false until the first report
    int64_t bad_reports = 0;           // plateau: reports since the last improvement
    int64_t cooldown_left = 0;         // plateau
  };
  State state() const;
  // Throws fabric::Error (and changes nothing) when `state` has another number of group scales
  // than the optimizer has groups.
  void load_state(const State& state);

  // Stateful: the State as a dictionary {"step", "group_scales", "lr_factor", "best", "has_best",
  // "bad_reports", "cooldown_left"}. Restoring accepts states from before parameter groups and
  // the plateau schedule (only "step"); it refuses another number of group ratios.
  c10::IValue save_state() const override;
  std::function<void()> prepare_restore(const c10::IValue& saved,
                                        const std::string& source) override;

 private:
  void apply();
  torch::optim::Optimizer& optimizer_;
  LRSchedule schedule_;
  int64_t step_ = 0;
  State state_;  // its step is kept in step_
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_LR_SCHEDULER_H_
