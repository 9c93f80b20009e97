// fabric::ExponentialMovingAverage: an average of a model's parameters over the optimizer steps,
// the weights many recipes evaluate and ship (Lightning's EMA/weight averaging, timm's ModelEma).
//
//   fabric::ExponentialMovingAverage ema(f.parameter_parts(*model), 0.999);  // after f.setup
//   ema.add_to(state, "ema");                             // checkpointed, resumes exactly
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
// parameters' storage from then on), from f.parameter_parts(model): every strategy, fsdp
// included. Under single device, dp and ddp each rank averages whole parameters (replicas are
// identical, and so are their averages); under fsdp each rank averages the part of every
// parameter it holds (1/N of the memory), swap_into_model() puts the averaged parts in place (the
// model gathers them as it gathers parameters), and checkpoints hold each rank's part as a piece
// (sharded) or the whole average (checkpoint.format: full), loadable at any world size and under
// any strategy. The constructor from a module alone is for unsplit parameters (it refuses a
// module whose parameters fsdp shards).
#ifndef FABRIC_TRAINING_EMA_H_
#define FABRIC_TRAINING_EMA_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/core/scope_guard.h"
#include "fabric/training/parameter_parts.h"

namespace fabric {

class ExponentialMovingAverage {
 public:
  // Starts from the current values of the parts (Fabric::parameter_parts(model)).
  // REQUIRES: 0 <= decay < 1 (else fabric::Error).
  ExponentialMovingAverage(ParameterParts parts, double decay, bool warmup = true);
  // Every floating-point parameter of `module`, whole. Throws fabric::Error when a parameter has
  // no memory of its own (sharded by fsdp: use the constructor above).
  ExponentialMovingAverage(torch::nn::Module& module, double decay, bool warmup = true);

  // One update from the module's parameters (after an optimizer step).
  void update();
  // The decay the next update() uses.
  double next_decay() const;
  int64_t updates() const { return updates_; }

  // Swaps the averages into the module's parameters (and the live values out) until the guard
  // ends, then swaps back: evaluate or export the averaged model inside. Not nestable.
  ScopeGuard swap_into_model();

  // Adds the averages ("<prefix>.<parameter name>"; split parts through
  // CheckpointState::add_split) and the update count ("<prefix>.updates") to a checkpoint, so a
  // resumed run continues the same average.
  void add_to(CheckpointState& state, const std::string& prefix);

 private:
  std::vector<torch::Tensor> live_averages() const;  // averages_ at live_index_

  double decay_;
  bool warmup_;
  int64_t updates_ = 0;
  ParameterParts parts_;
  std::vector<torch::Tensor> live_;      // the non-empty parts' values (aliases of the parameters)
  std::vector<size_t> live_index_;       // their indices in parts_.parts
  std::vector<torch::Tensor> averages_;  // one per part, in order
  bool swapped_ = false;
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_EMA_H_
