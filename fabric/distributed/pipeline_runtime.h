// fabric::distributed::PipelineRunner: runs one rank's part of a pipeline-parallel training step
// (issue 71): the forward and backward of every micro-batch through the virtual stages this rank
// holds, in the order a schedule gives (pipeline_schedule.h), with activations sent to the next
// stage's rank and their gradients back over c10d send/recv.
//
// The model stays the caller's: PipelineStageCalls says how to run one virtual stage and the
// loss. The runner owns only the tensors in flight:
//   - stage 0 gets no input (its forward reads micro-batch `mb` itself); every later stage gets
//     the previous stage's output, received (or handed over in memory when both stages are on
//     this rank), detached and requiring grad, so the stage's backward stops at its input and
//     the input's gradient is what travels back;
//   - the last stage's forward output goes to `loss`; its backward starts from loss / m, so the
//     parameters' gradients accumulate to those of the mean loss over the m micro-batches (what
//     one process computes on the whole batch, up to the order of the sums);
//   - every other stage's backward is torch::autograd::backward(output, received gradient).
// A stage's input, output and graph are released after its backward: a rank holds the
// activations of the micro-batches whose forward ran and backward did not (GPipe: all m; 1F1B:
// at most pp - rank), which peak_in_flight() reports.
//
// Communication: shapes are known ahead (PipelineOptions::activation_sizes, the same for every
// stage boundary and micro-batch), so a recv needs no handshake. Sends are asynchronous (isend);
// the runner waits for them at the end of the step. A recv is posted when the compute before it
// starts (recv_ahead) and waited for right before the compute that needs it, so a rank blocks no
// earlier than its data (the schedules are proven free of deadlock under that model,
// simulate_pipeline: posting a recv early never blocks). Each tensor has its own tag (kind, stage,
// micro-batch), so two tensors between the same ranks never match the wrong recv.
//
//   PipelineRunner runner(pp_group, options);
//   torch::Tensor mean_loss = runner.step(calls);   // on every rank of the pipeline
//   // then each rank clips/steps the optimizer of the parameters its stages hold
//
// Also: a timeline of the step's computes (for the bubble measured against theory), and
// sum_between (the tied embedding's gradient summed between the first and the last stage's ranks).
//
// Thread-safety: one runner per rank, used from one thread.
#ifndef FABRIC_DISTRIBUTED_PIPELINE_RUNTIME_H_
#define FABRIC_DISTRIBUTED_PIPELINE_RUNTIME_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fabric/distributed/pipeline_schedule.h"

namespace fabric::distributed {

struct PipelineStageCalls {
  // Virtual stage `stage`'s forward of micro-batch `micro_batch`. `input`: undefined for stage 0,
  // else the previous stage's output (requires grad). Returns the stage's output: for every stage
  // but the last, a tensor of PipelineOptions::activation_sizes and activation_dtype.
  std::function<at::Tensor(int64_t stage, int64_t micro_batch, const at::Tensor& input)> forward;
  // The last stage's loss of micro-batch `micro_batch` (a 0-dim tensor, the micro-batch's mean)
  // from that stage's forward output.
  std::function<at::Tensor(int64_t micro_batch, const at::Tensor& output)> loss;
  // Backward from the last stage's scaled loss (loss / micro_batches); null: loss.backward().
  // A GradScaler's precision passes its own (Precision::backward).
  std::function<void(const at::Tensor& scaled_loss)> backward;
};

struct PipelineOptions {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int64_t micro_batches = 1;
  int64_t virtual_stages = 1;
  // One micro-batch's activation between two stages (e.g. {B / m, T, C}) and its dtype.
  std::vector<int64_t> activation_sizes;
  c10::ScalarType activation_dtype = c10::kFloat;
  c10::Device device = c10::kCPU;
  // Record when each compute starts and ends (timeline()). On a CUDA device each timestamp first
  // synchronizes the current stream (kernels run after their launch returns), so the times are
  // the work's own; that adds a host-device sync at every compute's start and end, which the
  // step then pays (a measuring option, not for training).
  bool record_timeline = false;
  // Post the next recv when the compute before it starts, so its transfer overlaps that
  // compute; false: post each recv when it is reached (then it waits for the whole transfer).
  bool recv_ahead = true;
};

// One forward or backward of the step, in seconds from the step's start.
struct PipelineEvent {
  bool forward = true;
  int64_t stage = 0;
  int64_t micro_batch = 0;
  double start = 0, end = 0;
};

class PipelineRunner {
 public:
  // `group`: the ranks of this pipeline (rank r of the group holds virtual stages r, r + pp, ...).
  // null group: a pipeline of one rank (every stage here, virtual_stages of them). The schedule's
  // requirements (pipeline_actions) are checked here: fabric::Error naming the numbers and a fix.
  PipelineRunner(c10::intrusive_ptr<c10d::ProcessGroup> group, PipelineOptions options);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  const PipelineOptions& options() const { return options_; }
  int64_t rank() const { return rank_; }
  int64_t size() const { return pp_; }
  int64_t stages() const { return pp_ * options_.virtual_stages; }
  // The virtual stages this rank runs, in model order: rank, rank + pp, ...
  std::vector<int64_t> local_stages() const;
  bool holds(int64_t stage) const { return stage % pp_ == rank_; }
  bool holds_first() const { return holds(0); }
  bool holds_last() const { return holds(stages() - 1); }
  const std::vector<PipelineAction>& actions() const { return actions_; }

  // One step: every action of this rank in order. Returns the mean of the micro-batches' losses
  // (0-dim float32, detached) on every rank of the group (broadcast from the last stage's rank).
  // Gradients accumulate into whatever the stages' forwards used (zero them before, as usual).
  // A forward output of the wrong shape or dtype throws fabric::Error naming the stage.
  at::Tensor step(const PipelineStageCalls& calls);

  // The forwards only, without gradients (torch::NoGradGuard): each local stage over every
  // micro-batch in turn, activations sent on and dropped. Returns the mean of the micro-batches'
  // losses on every rank of the group, as step() does; no gradient changes. For validation.
  at::Tensor evaluate(const PipelineStageCalls& calls);

  // The most (stage, micro-batch) activations this rank held at once in the last step.
  int64_t peak_in_flight() const { return peak_in_flight_; }
  // The last step's computes (PipelineOptions::record_timeline), in the order they ran.
  const std::vector<PipelineEvent>& timeline() const { return timeline_; }

  // Collective over the group: scales the gradients of `parameters` (those this rank's stages
  // hold) so that their total 2-norm over the whole pipeline is at most `max_norm`, as
  // torch::nn::utils::clip_grad_norm_ does for one process (coefficient max_norm / (norm + 1e-6),
  // at most 1), and returns that total norm (0-dim float32). `shared`: parameters two ranks hold
  // (a tied embedding, after sum_between), counted once, on the first stage's rank. Parameters
  // without a gradient are skipped. Not for parameters split over tp (they would be counted once
  // per tp rank).
  at::Tensor clip_grad_norm(const std::vector<at::Tensor>& parameters, double max_norm,
                            const std::vector<at::Tensor>& shared = {});

  // Collective over the group's ranks `a` and `b` only (the others return at once): `t` becomes
  // the sum of theirs, bitwise the same on both (rank a adds, then sends the sum back). For a
  // parameter held by two stages, e.g. a token embedding tied to the output layer. a == b: no-op.
  void sum_between(at::Tensor& t, int64_t a, int64_t b);

 private:
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  PipelineOptions options_;
  int64_t rank_ = 0, pp_ = 1;
  // step()'s and evaluate()'s bodies: `actions` in order; train: inputs require grad, the last
  // stage's loss is kept for backward.
  at::Tensor run(const std::vector<PipelineAction>& actions, const PipelineStageCalls& calls,
                 bool train);

  std::vector<PipelineAction> actions_, forward_actions_;
  bool host_wire_ = false;  // CUDA tensors sent and received through host memory (Gloo)
  int64_t peak_in_flight_ = 0;
  std::vector<PipelineEvent> timeline_;
};

// `batch` cut along dimension 0 into `micro_batches` equal micro-batches (views), as the runner
// needs them (one activation shape for all). fabric::Error when they do not divide it, one line
// naming both and the sizes that would, e.g. "a batch of 6 rows does not split into 4 equal
// micro-batches (fabric.pipeline.micro_batches); use a batch size that is a multiple of 4 (4, 8,
// ...), or micro_batches that divides 6 (1, 2, 3, 6)".
std::vector<at::Tensor> split_micro_batches(const at::Tensor& batch, int64_t micro_batches);

// The idle share of one rank's step: 1 - (time its computes took) / makespan. `makespan`: the
// step's length over all ranks of the pipeline (the latest end anywhere, from a common start);
// <= 0: this timeline's last end. 0 for an empty timeline.
double bubble_fraction(const std::vector<PipelineEvent>& timeline, double makespan = 0);

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_PIPELINE_RUNTIME_H_
