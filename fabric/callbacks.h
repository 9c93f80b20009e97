// Built-in callbacks (fabric/callback.h), made from the config's callbacks: section by
// make_callbacks (the examples register them):
//
//   callbacks.early_stopping.monitor   ""     a metric the loop passes to on_validation_end (the
//                                             examples: test/accuracy; gpt: val/loss); "": off
//   callbacks.early_stopping.mode      auto   max | min | auto (min for names with "loss", else
//   max) callbacks.early_stopping.patience  3      evaluations without improvement before stopping
//   callbacks.early_stopping.min_delta 0.0    an improvement must exceed this
//   callbacks.model_summary            false  print the model's parameters per top-level module
//   callbacks.lr_monitor               false  log lr/group_N of every parameter group
//                                             every logging.log_every_n_steps optimizer steps
//   profiler.enabled                   false  LibTorch's profiler on a schedule of steps
//                                             (ProfilerCallback below; profiler.* keys)
//
// EarlyStopping stops every rank at the same step: the loop asks Fabric::should_stop(), which
// takes global rank 0's decision. It is a fabric::Stateful (best value and its step, evaluations
// without improvement), so a resumed run stops where the uninterrupted one would; a checkpoint of
// a run that watched another metric restores nothing (the new metric starts afresh).
#ifndef FABRIC_CALLBACKS_H_
#define FABRIC_CALLBACKS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "fabric/callback.h"
#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/config/config.h"
#include "fabric/core/stateful.h"
#include "fabric/training/profiler.h"

namespace fabric {

struct EarlyStoppingOptions {
  std::string monitor;
  std::string mode = "auto";  // max | min | auto
  int64_t patience = 3;
  double min_delta = 0.0;
};

class EarlyStopping : public Callback, public Stateful {
 public:
  // Throws fabric::Error for an empty monitor, a mode other than max/min/auto, patience < 1 or
  // min_delta < 0.
  explicit EarlyStopping(EarlyStoppingOptions options);

  std::string name() const override { return "early_stopping"; }
  // Throws fabric::Error naming the metrics there are when `metrics` lacks the monitored one.
  void on_validation_end(Fabric& f, int64_t step, const Metrics& metrics) override;
  std::string stop_reason() const override { return reason_; }

  c10::IValue save_state() const override;
  std::function<void()> prepare_restore(const c10::IValue& saved,
                                        const std::string& source) override;

  // The best value so far (nullopt before the first evaluation) and the step it was seen at.
  std::optional<double> best() const { return best_; }
  int64_t best_step() const { return best_step_; }
  // Evaluations since the last improvement.
  int64_t wait() const { return wait_; }
  bool maximize() const { return maximize_; }

 private:
  EarlyStoppingOptions options_;
  bool maximize_;
  std::optional<double> best_;
  int64_t best_step_ = 0;
  int64_t wait_ = 0;
  std::string reason_;
};

// At on_fit_start, global rank 0 prints each top-level module's type, parameter count and bytes,
// with the totals and the trainable count (shapes as built: the same under every strategy).
class ModelSummary : public Callback {
 public:
  explicit ModelSummary(const torch::nn::Module& module);
  std::string name() const override { return "model_summary"; }
  void on_fit_start(Fabric& f) override;
  // The lines on_fit_start prints.
  const std::vector<std::string>& lines() const { return lines_; }

 private:
  std::vector<std::string> lines_;
};

// Logs lr/group_0, lr/group_1, ... (the optimizer's current rates) at every `every`-th
// on_train_batch_end step.
class LearningRateMonitor : public Callback {
 public:
  LearningRateMonitor(const torch::optim::Optimizer& optimizer, int64_t every);
  std::string name() const override { return "lr_monitor"; }
  void on_train_batch_end(Fabric& f, int64_t step, const Metrics& values) override;

 private:
  const torch::optim::Optimizer& optimizer_;
  int64_t every_;
};

// profiler.*: a fabric::StepProfiler (fabric/training/profiler.h) stepped at every
// on_train_batch_end; each rank writes its traces to <run dir>/profiler/ and, at on_fit_end,
// global rank 0 prints where they are and its top-ops table.
class ProfilerCallback : public Callback {
 public:
  explicit ProfilerCallback(StepProfilerOptions options) : options_(std::move(options)) {}
  std::string name() const override { return "profiler"; }
  void on_train_batch_end(Fabric& f, int64_t step, const Metrics& values) override;
  void on_fit_end(Fabric& f) override;
  const StepProfiler* profiler() const { return profiler_.get(); }

 private:
  StepProfilerOptions options_;
  std::unique_ptr<StepProfiler> profiler_;
};

// Adds each callback of `f` that is also a fabric::Stateful to `state` as "callbacks.<name>", so
// a checkpoint holds it and a resumed run continues it.
void add_stateful_callbacks(const Fabric& f, CheckpointState& state);

// The profiler: section's options (add_profiler_keys' keys; the dir and rank are the callback's
// to set), or nullopt when profiler.enabled is false; a ConfigError at profiler.activities
// naming neither cpu nor cuda.
std::optional<StepProfilerOptions> profiler_options(const Config& config);

// The callbacks the config asks for; errors are ConfigErrors at their key. Needs
// training_schema()'s callbacks: keys. `module` and `optimizer` (set up already) are what
// model_summary and lr_monitor watch; a key that needs one that is null is an error at the key.
std::vector<std::shared_ptr<Callback>> make_callbacks(
    const Config& config, const torch::nn::Module* module = nullptr,
    const torch::optim::Optimizer* optimizer = nullptr);

}  // namespace fabric

#endif  // FABRIC_CALLBACKS_H_
