// fabric::strategies::Fsdp: fully sharded data parallel (fabric.strategy: fsdp). Each of the N
// ranks keeps 1/N of every parameter, gradient and optimizer state; a unit's parameters are
// gathered whole only while an operation uses them (strategies/sharded_parameters.h explains
// the units, the trigger and when memory is freed) and its gradients are reduce-scattered as
// soon as the backward pass has produced them. The optimizer steps this rank's pieces only
// (strategies/optimizer_shard.h, one segment per unit).
//
// Lifecycle: setup_environment() joins the rendezvous as ddp does; setup_module() moves and
// converts the module, checks that every rank has the same parameter shapes, broadcasts
// parameters and buffers from rank 0, then shards the parameters; setup_optimizer() rewrites the
// optimizer to this rank's pieces (one optimizer, set up after the module). backward() reduces
// the gradients (unless inside no_backward_sync: they accumulate whole until the next
// synchronized backward, or Fabric::step, which reduces them first). Checkpoints:
// sharded by default (checkpoint.format: auto): every rank writes its pieces of the parameters and
// optimizer state, nothing gathered (fabric/checkpoint/sharded.h); with checkpoint.format: full,
// Fabric::save gathers the module (materialize_parameters) and the optimizer state (one process's
// layout) on every rank and rank 0 writes one file. Both load at any world size and under any
// strategy. teardown() gives every parameter its full value again, so the module works after
// Fabric::launch returns.
//
// Selected by the Connector for fabric.strategy: fsdp with sharding_strategy full_shard or
// shard_grad_op (no_shard is ddp).
#ifndef STRATEGIES_FSDP_H_
#define STRATEGIES_FSDP_H_

#include <memory>
#include <string>
#include <vector>

#include "fabric/core/cluster_environment.h"
#include "strategies/ddp_options.h"
#include "strategies/parallel.h"

namespace fabric::strategies {

class ShardedParameters;

class Fsdp : public ParallelStrategy {
 public:
  // `ddp`: the process group settings (timeout, backends, heartbeat); `argv` as for Ddp.
  Fsdp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
       std::unique_ptr<Precision> precision, const DdpOptions& ddp, FsdpOptions options,
       std::vector<std::string> argv);
  ~Fsdp() override;

  std::string name() const override { return "fsdp"; }

  void setup_module(torch::nn::Module& module) override;
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  void backward(const torch::Tensor& loss) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer) override;
  ScopeGuard materialize_parameters(torch::nn::Module& module, bool write_back) override;
  // ShardedState: the parameters' shards and the split optimizer's pieces.
  ShardedState* sharded_state() override { return this; }
  std::optional<c10::IValue> local_module_state(torch::nn::Module& module) override;
  std::optional<PieceRange> wanted_module_piece(const torch::nn::Module& module,
                                                const std::string& path, at::IntArrayRef sizes,
                                                at::IntArrayRef strides,
                                                const std::optional<PieceLayout>& layout) override;
  std::optional<std::function<void()>> prepare_local_module_state(
      torch::nn::Module& module, const c10::IValue& value, const std::string& source) override;
  // A sharded parameter as this rank's elements of it (a view of its shard).
  ParameterParts parameter_parts(torch::nn::Module& module) override;
  ScopeGuard no_backward_sync() override;
  // Reduce-scatters the gradients accumulated whole under no_backward_sync (every unit, as the
  // end of a synchronized backward does) and attaches the shards' gradients.
  void sync_accumulated_gradients() override;
  // sync_accumulated_gradients() when a backward inside no_backward_sync came last.
  void sync_unsynced_gradients() override;
  void set_capturable_gradient_sync(bool on) override;
  void teardown() override;

  // The sharded parameters (null before setup_module): units, gathers, reduce-scatters.
  const ShardedParameters* sharded() const { return sharded_.get(); }
  int64_t synced_backward_passes() const { return synced_backwards_; }

 protected:
  void release() override;
  // teardown()'s first step: the parameters whole again (collective; a module built empty goes
  // back to meta), then release().
  void release_shards_whole();
  // An empty init's replayed `value` of the module's tensor `held`, as this process keeps it
  // (model_parallel: its tp slice); the value itself here.
  virtual torch::Tensor initial_value(const torch::Tensor& held, const torch::Tensor& value) {
    (void)held;
    return value;
  }
  // The group of ranks holding the same shards as this one (hybrid sharding); null: none.
  virtual c10::intrusive_ptr<c10d::ProcessGroup> replicate_group() const;

  FsdpOptions options_;
  std::string key_;  // "fabric.strategy: fsdp", or the strategy built on this one, in errors
  const torch::nn::Module* module_ = nullptr;
  std::unique_ptr<ShardedParameters> sharded_;
  std::vector<torch::Tensor> params_;  // those that require gradients, in module order
  std::vector<std::string> param_names_;
  bool sync_ = true;
  bool unsynced_ = false;  // a backward inside no_backward_sync since the last synchronization
  int64_t synced_backwards_ = 0;
  bool built_empty_ = false;  // the module was built by an empty init (teardown leaves it meta)
  // setup_module: the module already holds rank 0's values on every rank (model_parallel
  // broadcasts them over the world before cutting): no broadcast over the group.
  bool values_broadcast_ = false;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_FSDP_H_
