// What acts at an example's evaluations: early stopping (callbacks.early_stopping.monitor) and the
// plateau schedule (scheduler.name: plateau watching scheduler.monitor). Both are checked before
// any training, against what the loop reports, so a key the loop cannot honour is a one-line
// ConfigError (exit 2; fabric.max_restarts never restarts one) instead of a key that does
// nothing, or an error after the first evaluation.
#ifndef EXAMPLES_COMMON_EVALUATIONS_H_
#define EXAMPLES_COMMON_EVALUATIONS_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/config/config.h"
#include "fabric/fabric.h"
#include "fabric/training/lr_scheduler.h"

namespace examples {

// A loop's evaluations as the config keys meet them.
struct Evaluations {
  std::string every_key;              // how often: "gpt.eval_every_n_steps" (0: at the end only)
  std::vector<std::string> metrics;   // what the loop passes to on_validation_end
  std::vector<std::string> monitors;  // the scheduler.monitor values it can report
};

// ConfigErrors at the key, before training: callbacks.early_stopping.monitor or
// scheduler.name: plateau while `every_key` is 0 (one evaluation, at the end: neither could act),
// an early-stopping monitor that is not one of `metrics`, a plateau scheduler.monitor not among
// `monitors`.
void check_evaluation_keys(const fabric::Config& c, const Evaluations& e);

// scheduler.name: plateau in a loop of optimizer steps: step() after every step (train/loss: the
// loss averaged over the ranks, one scalar all-reduce a step, so every rank and rank 0's
// checkpoint hold the same sum), report() at every evaluation: the monitored value goes to the
// scheduler and into the metrics as scheduler/monitored. Inactive (no work) without plateau.
class PlateauReport {
 public:
  explicit PlateauReport(fabric::Fabric& f);
  bool active() const { return active_; }
  // The loss sum since the last report, when train/loss is watched (a resume continues it).
  void add_to(fabric::CheckpointState& state);
  void step(const torch::Tensor& loss);
  // `evaluated`: the validation metric of this evaluation (used unless train/loss is watched).
  void report(fabric::LRScheduler& scheduler, double evaluated, int64_t step);

 private:
  fabric::Fabric& f_;
  bool active_ = false, train_loss_ = false;
  torch::Tensor loss_since_report_;
  int64_t steps_since_report_ = 0;
};

}  // namespace examples

#endif  // EXAMPLES_COMMON_EVALUATIONS_H_
