// fabric::ExponentialMovingAverage: an average of a model's parameters over the optimizer steps,
// the weights many recipes evaluate and ship (Lightning's EMA/weight averaging, timm's ModelEma).
//
//   fabric::ExponentialMovingAverage ema(model, 0.999);   // after f.setup(model, optimizer)
//   state.add_all(ema, "ema");                            // checkpointed, resumes exactly
//   for (...) { ...; f.step(optimizer); ema.update(); }
//   { auto averaged = ema.swap_into_model(); evaluate(model); f.save_weights(model, path); }
//
// update() after each optimizer step: average ← average + (1 − d)·(parameter − average), for every
// parameter in one foreach call (torch::_foreach_lerp_). With warm-up (the default), update n
// (1-based) uses d = min(decay, (1 + n) / (10 + n)), so early averages are not dominated by the
// random initialization (TensorFlow's ExponentialMovingAverage with num_updates); without it d =
// decay from the start. Only floating-point parameters are averaged; buffers (BatchNorm statistics)
// are the model's own. The averages live on the parameters' device, in their dtype.
//
// Construct it after Fabric::setup (which moves the parameters in place; the average follows the
// parameters' storage from then on). Strategies: single device, dp and ddp (replicas are identical,
// and so are their averages). Not under fsdp, which shards the parameters: each rank would average
// only its pieces, and swapping would miss the gathered whole (the examples refuse
// trainer.ema_decay there with a one-line error).
#ifndef FABRIC_TRAINING_EMA_H_
#define FABRIC_TRAINING_EMA_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/core/scope_guard.h"

namespace fabric {

class ExponentialMovingAverage {
 public:
  // Starts from the module's current parameters. REQUIRES: 0 <= decay < 1 (else fabric::Error).
  ExponentialMovingAverage(torch::nn::Module& module, double decay, bool warmup = true);

  // One update from the module's parameters (after an optimizer step).
  void update();
  // The decay the next update() uses.
  double next_decay() const;
  int64_t updates() const { return updates_; }

  // Swaps the averages into the module's parameters (and the live values out) until the guard
  // ends, then swaps back: evaluate or export the averaged model inside. Not nestable.
  ScopeGuard swap_into_model();

  // Adds the averages ("<prefix>.<parameter name>") and the update count ("<prefix>.updates") to
  // a checkpoint, so a resumed run continues the same average.
  void add_to(CheckpointState& state, const std::string& prefix);

 private:
  double decay_;
  bool warmup_;
  int64_t updates_ = 0;
  std::vector<std::string> names_;
  std::vector<torch::Tensor> params_;    // the module's parameters (detached aliases)
  std::vector<torch::Tensor> averages_;  // same order
  bool swapped_ = false;
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_EMA_H_
