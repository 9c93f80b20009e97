// fabric::Strategy: how a model is trained across processes and devices; the implementations
// (single_device, dp, ddp) sit beside it. Not in fabric/core because it owns a Precision:
// fabric/core depends on nothing of ours. It owns the Precision and, when distributed, the
// process group; Fabric delegates every call to it.
//
// Contract for implementations: setup_environment() runs once per process inside Fabric::launch
// before the user's function; every collective must be called by all ranks in the same order.
#ifndef STRATEGIES_STRATEGY_H_
#define STRATEGIES_STRATEGY_H_

#include <ATen/core/ivalue.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/checkpoint/sharded_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/scope_guard.h"
#include "fabric/nn/fp8.h"
#include "fabric/precision/precision.h"
#include "fabric/training/parameter_parts.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fabric {

class InitRecord;  // fabric/nn/empty_init.h

enum class ReduceOp { kSum, kMean, kMax, kMin };

class Strategy {
 public:
  virtual ~Strategy() = default;

  virtual std::string name() const = 0;
  // The device this process computes on.
  virtual torch::Device root_device() const = 0;
  virtual int64_t world_size() const { return 1; }
  virtual int64_t global_rank() const { return 0; }
  virtual int64_t local_rank() const { return 0; }
  virtual int64_t node_rank() const { return 0; }
  // The ranks that see different data (the sampler's replicas) and this rank's place among them:
  // the world, except under model_parallel, where the ranks of one tensor-parallel group share
  // their data.
  virtual int64_t data_parallel_size() const { return world_size(); }
  virtual int64_t data_parallel_rank() const { return global_rank(); }

  // dp only: the devices Fabric::forward spreads each batch over (null: forward runs the model).
  virtual const std::vector<torch::Device>* replica_devices() const { return nullptr; }

  // Per-process setup inside launch (current device, process group).
  virtual void setup_environment() {}
  // Per-process teardown after the user's function returned normally.
  virtual void teardown() {}
  // Teardown after the user's function threw: must not wait for other ranks.
  virtual void teardown_after_error() {}

  // Moves `module` to root_device(), converts it for the precision, and prepares gradient sync.
  // A module built under an empty init (fabric/nn/empty_init.h) gets its values from the record
  // given to set_empty_init first: whole on the device, or under fsdp only this rank's shards.
  virtual void setup_module(torch::nn::Module& module) = 0;
  // The record of the empty init that built the module of the next setup_module (consumed by it).
  void set_empty_init(std::shared_ptr<InitRecord> record) { empty_init_ = std::move(record); }
  virtual void setup_optimizer(torch::optim::Optimizer& optimizer) { (void)optimizer; }

  virtual void backward(const torch::Tensor& loss) { precision_->backward(loss); }
  virtual bool optimizer_step(torch::optim::Optimizer& optimizer) {
    return precision_->optimizer_step(optimizer);
  }

  // Collectives. Single-process strategies return the input (kMean of one value is the value).
  virtual torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op) = 0;
  virtual void barrier() {}
  virtual torch::Tensor broadcast(const torch::Tensor& tensor, int64_t src) = 0;
  // Every rank's `tensor`, in rank order; REQUIRES: the same shape and dtype on every rank.
  virtual std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) { return {tensor}; }

  // A strategy that splits parameters or optimizer state over the ranks: what each rank holds
  // and wants of a checkpoint (fabric/checkpoint/sharded_state.h); null (the default) when every
  // rank holds the same state. checkpoint.format auto writes sharded folders when it is not null.
  virtual ShardedState* sharded_state() { return nullptr; }

  // Fabric::clip_gradients after unscaling: scales the gradients `optimizer` steps so that their
  // total `norm_type` norm is at most `max_norm`; returns the norm before clipping (0-dim, on the
  // device). The default clips the gradients of `parameters` (fabric/training/clip.h); a strategy
  // that splits the gradients over the ranks takes the norm over all of them (collective).
  virtual torch::Tensor clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                            torch::optim::Optimizer& optimizer, double max_norm,
                                            double norm_type);
  // Clamps the same gradients to [-clip_value, clip_value].
  virtual void clip_gradients_value(const std::vector<torch::Tensor>& parameters,
                                    torch::optim::Optimizer& optimizer, double clip_value);

  // Collective. While the guard lives, `module`'s parameters hold their full values on every
  // rank (a strategy that shards them gathers them; the default does nothing). `write_back`:
  // values written to them meanwhile are kept (loading); otherwise they are only read (saving).
  virtual ScopeGuard materialize_parameters(torch::nn::Module& module, bool write_back) {
    (void)module;
    (void)write_back;
    return ScopeGuard();
  }

  // This rank's part of each floating-point parameter of `module` (after setup_module), for
  // state kept per parameter beside the optimizer (fabric::ExponentialMovingAverage). The
  // default: every parameter whole; a strategy that shards parameters gives its pieces.
  virtual ParameterParts parameter_parts(torch::nn::Module& module);

  // Skips gradient synchronization (of every module set up) while the guard lives: gradient
  // accumulation.
  virtual ScopeGuard no_backward_sync() { return ScopeGuard(); }
  // Synchronizes the gradients accumulated whole under no_backward_sync as a synchronized
  // backward would have, without one (a pipeline step runs many backwards and syncs after the
  // last: Fabric::pipeline_backward). fabric::Error here; fsdp and model_parallel implement it.
  virtual void sync_accumulated_gradients();
  // When backward passes ran inside no_backward_sync since the gradients were last synchronized
  // (every micro-batch of a step under the guard): synchronizes them now, as the last one's
  // backward would have. Fabric::step and clip_gradients call it first, so a step never applies,
  // nor a clip measures, one rank's own gradients. Nothing otherwise (and for one process).
  virtual void sync_unsynced_gradients() {}

  // Pipeline parallelism (fabric.model_parallel.pipeline_parallel_size > 1): the process group of
  // this rank's pipeline (the ranks that hold the other stages of the same data), null without.
  virtual c10::intrusive_ptr<c10d::ProcessGroup> pipeline_group() const;
  // Context parallelism (fabric.model_parallel.context_parallel_size > 1): the ranks that split
  // each sequence (a model's set_context_parallel takes it), null without.
  virtual c10::intrusive_ptr<c10d::ProcessGroup> context_parallel_group() const;
  // `parameter` is also held by another rank of the pipeline with the same gradient (an
  // embedding tied to the output layer of the last stage): the gradient norm counts it only
  // where `counted_here`. Before setup_optimizer. A no-op without a pipeline.
  virtual void set_shared_parameter(const torch::Tensor& parameter, bool counted_here) {
    (void)parameter;
    (void)counted_here;
  }
  // Collective over the pipeline: every stage's `local` state (names of the whole model) joined
  // on the pipeline's first rank, in stage order; the other ranks get theirs back. `local`
  // itself without a pipeline. (Over exchange_pipeline; a tied name kept once, the first stage's.)
  StateDict gather_pipeline_state(StateDict local);
  // Collective over the pipeline: every stage's `mine` in stage order, on every rank of it
  // (`everyone`) or on its first rank only (the others get {mine}). {mine} without a pipeline.
  virtual std::vector<c10::IValue> exchange_pipeline(const c10::IValue& mine, bool everyone) {
    (void)everyone;
    return {mine};
  }
  // Whether this rank is the first of the ranks that hold its pipeline stage (data- and
  // tensor-parallel coordinates 0): it writes what its stage alone holds whole. True without.
  virtual bool first_of_stage() const { return true; }

  // Gradient synchronization a CUDA graph can capture (fabric/graphed_step.h turns it on
  // for its lifetime): a strategy that synchronizes gradients from hooks during backward, with
  // host bookkeeping between kernels, does it after backward through persistent buffers instead.
  virtual void set_capturable_gradient_sync(bool on) { (void)on; }

  Precision& precision() { return *precision_; }
  const Precision& precision() const { return *precision_; }
  // What the module's setup did under fp8-mixed (empty otherwise): which Linear layers run their
  // GEMMs in float8 and why the others do not.
  const fabric::nn::Fp8Conversion& fp8_conversion() const { return fp8_conversion_; }

 protected:
  explicit Strategy(std::unique_ptr<Precision> precision) : precision_(std::move(precision)) {}
  // Takes the pending empty init's record (consumed) when `module` has meta tensors to give
  // values to; null when it has none. Throws fabric::Error for meta tensors and no record.
  std::shared_ptr<InitRecord> take_empty_init(const torch::nn::Module& module);
  // The whole-model strategies' first step of setup_module: a pending empty init's values,
  // whole, on `device` (nothing when there is none).
  void materialize_empty_init(torch::nn::Module& module, torch::Device device);
  // The precision's conversion of `module` (Precision::convert_module) and, under fp8-mixed, the
  // float8 GEMMs of its fabric::nn::Linear layers but those fabric.fp8.exclude_modules names
  // (fabric::Error when no layer is left to convert, naming why).
  void convert_module(torch::nn::Module& module);
  std::unique_ptr<Precision> precision_;
  std::shared_ptr<InitRecord> empty_init_;
  fabric::nn::Fp8Conversion fp8_conversion_;
};

}  // namespace fabric

#endif  // STRATEGIES_STRATEGY_H_
