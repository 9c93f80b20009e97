// fabric::GraphedStep: one whole training step (zero_grad, the loss function's forward,
// Fabric::backward, Fabric::step) that with `fabric.cuda_graphs: true` is captured once as a CUDA
// graph and then replayed: designed as one graph launch per step instead of hundreds of kernel
// launches, with no host work per step beyond copying the batch in (not yet run on a GPU).
//
//   fabric::GraphedStep step(f, optimizer, [&](const std::vector<torch::Tensor>& batch) {
//     return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
//   });
//   for (auto& b : loader) { torch::Tensor loss = step({b.data, b.target}); ... }
//
// Every call is one optimizer step on its batch, eager or replayed; with clip_norm or clip_value
// in the options the gradients are clipped between backward and the optimizer step. Without graphs
// (the default, and on CPU) a call is exactly the loop it replaces.
//
// With graphs: the first `warmup_steps` calls (default 3, at least 1) run eagerly on a side stream
// (cuDNN picks algorithms, the optimizer makes its state, the allocator warms up); the next call
// captures the step with static copies of its batch and replays it; every later call copies its
// batch into those copies and replays. The learning rate is read from a device tensor that is
// refreshed from the optimizer's options before every step, so LR schedules work; a 16-mixed
// GradScaler's unscale, skip and scale update run on the device. A batch whose shapes or dtypes
// differ from the captured one (a smaller last batch) runs eagerly, with one warning line.
//
// Under ddp the graph holds the gradient all-reduce (NCCL) too: while a GraphedStep lives, the
// strategy averages gradients after backward through persistent buffers
// (strategies/flat_gradient_sync.h, bitwise the Reducer's arithmetic) instead of from hooks
// during backward, and every rank captures at the same step. broadcast_buffers is captured too.
//
// Refusals: fabric.cuda_graphs on a CPU device, under strategy dp, or under ddp with
// sync_batchnorm (it reads the global batch size on the host) or find_unused_parameters gives
// one warning line at setup and eager steps (fabric/connector.h); an optimizer other than
// fabric::SGD / Adam / AdamW with the fused implementation is a fabric::Error here; a loss
// function that waits for the host (.item(), printing a tensor, CPU tensors) cannot be captured:
// the capture fails with a fabric::Error saying so, leaving nothing of it behind (the next call
// captures again). The capture checks only its own thread's CUDA calls (thread-local mode), so
// DataLoader workers may pin and copy the next batches meanwhile. The loss returned is a detached
// copy.
//
// Unverified on a GPU so far (no GPU was available to the sessions that wrote it): the capture
// path is compiled in CUDA builds only and tested by tests/integration/cuda_graphs_test.cc there.
#ifndef FABRIC_GRAPHED_STEP_H_
#define FABRIC_GRAPHED_STEP_H_

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "fabric/core/arg.h"
#include "fabric/training/accumulation.h"

namespace fabric {

class Fabric;
class ScaledStep;

// Example: GraphedStepOptions().clip_norm(1.0).
struct GraphedStepOptions {
  FABRIC_ARG(int, warmup_steps) = 3;  // Default: 3 eager steps before the capture (at least 1).
  // Gradient clipping inside the step, after backward (16-mixed gradients unscaled first), over
  // the optimizer's parameters, without reading anything on the host: the arithmetic of
  // Fabric::clip_gradients (clip_norm, norm_type) and Fabric::clip_gradients_value (clip_value).
  // 0: off; at most one of the two. (trainer.gradient_clip_val / gradient_clip_algorithm.)
  FABRIC_ARG(double, clip_norm) = 0;
  FABRIC_ARG(double, norm_type) = 2.0;
  FABRIC_ARG(double, clip_value) = 0;
};

class GraphedStep {
 public:
  using LossFunction = std::function<torch::Tensor(const std::vector<torch::Tensor>& batch)>;

  // `fabric`, `optimizer` and what `loss` refers to must outlive this object; set them up first
  // (clipping covers the optimizer's parameters as they are at construction).
  GraphedStep(Fabric& fabric, torch::optim::Optimizer& optimizer, LossFunction loss,
              GraphedStepOptions options = {});
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // One training step on `batch`; returns the loss (detached).
  torch::Tensor operator()(const std::vector<torch::Tensor>& batch);
  // Gradient accumulation (fabric/training/accumulation.h): micro-batch `micro` of an optimizer
  // step: zero_grad on the first, Fabric::backward(loss, micro) on each, clipping and the
  // optimizer step after the last. Returns this micro-batch's loss (detached, not divided).
  // Eager only: with fabric.cuda_graphs and micro.count > 1 it throws fabric::Error naming both
  // keys. {0, 1} is operator()(batch).
  torch::Tensor operator()(const std::vector<torch::Tensor>& batch, MicroBatch micro);

  bool graphed() const { return enabled_; }       // fabric.cuda_graphs in effect
  int64_t replays() const { return replays_; }    // steps run by replaying the graph
  int64_t eager_steps() const { return eager_; }  // steps run eagerly
  // With clip_norm: the total gradient norm before clipping at the latest step, a 0-dim tensor
  // on the device (undefined without clip_norm, or before the first step). Replays rewrite it in
  // place: clone it to keep a step's value; reading it on the host waits for the step.
  const torch::Tensor& grad_norm() const { return grad_norm_; }

 private:
  torch::Tensor eager(const std::vector<torch::Tensor>& batch);
  // backward, clipping and the optimizer step after the loss: what the graph captures.
  void backward_and_step(const torch::Tensor& loss);
  void clip_and_step();
  // After a failed capture: ends it and drops everything it made, so the next call retries.
  void discard_capture();

  Fabric& fabric_;
  torch::optim::Optimizer& optimizer_;
  LossFunction loss_;
  GraphedStepOptions options_;
  bool enabled_ = false;
  ScaledStep* scaled_ = nullptr;
  int64_t replays_ = 0, eager_ = 0;
  bool warned_shape_ = false;
  torch::Tensor grad_norm_;
  std::vector<torch::Tensor> clipped_;  // the optimizer's parameters, when clipping
  struct Graph;                         // CUDA builds: the captured graph and its static tensors
  std::unique_ptr<Graph> graph_;
};

}  // namespace fabric

#endif  // FABRIC_GRAPHED_STEP_H_
