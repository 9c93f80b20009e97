// fabric::strategies::ParallelStrategy: the part every multi-process strategy shares (Lightning
// calls it ParallelStrategy too): the job's ranks from its ClusterEnvironment, one device per
// process, the rendezvous (fabric/distributed/rendezvous.h: store, self-launch, process group,
// heartbeat, collective checking) and Fabric's collectives over its process group, each numbered
// and named in errors. Ddp derives from it; a sharding strategy will too.
//
// Lifecycle: setup_environment() makes the device current and joins the rendezvous; teardown()
// calls release() and then ends the rendezvous cleanly; teardown_after_error() calls release()
// and ends it without waiting for other ranks.
#ifndef STRATEGIES_PARALLEL_H_
#define STRATEGIES_PARALLEL_H_

#include <memory>
#include <string>
#include <vector>

#include "fabric/core/cluster_environment.h"
#include "fabric/distributed/rendezvous.h"
#include "strategies/ddp_options.h"
#include "strategies/strategy.h"

namespace fabric::strategies {

class OptimizerShard;

// The rendezvous settings of fabric.ddp.* (ddp and fsdp share them); `argv`: the command line
// self-launched ranks run (empty: /proc/self/cmdline).
distributed::RendezvousOptions rendezvous_options(const DdpOptions& options,
                                                  std::vector<std::string> argv);

// `tensors` as the process group's collectives can carry them: a float8 tensor (a LoRA base
// stored in fp8, fabric/nn/frozen_weight.h) as a uint8 view of its bytes (Gloo reduces no
// float8; a broadcast or gather only moves bytes). The others as they are.
std::vector<torch::Tensor> float8_as_bytes(std::vector<torch::Tensor> tensors);

class ParallelStrategy : public Strategy, public ShardedState {
 public:
  ~ParallelStrategy() override;

  torch::Device root_device() const override { return device_; }
  int64_t world_size() const override { return env_->world_size(); }
  int64_t global_rank() const override { return env_->global_rank(); }
  int64_t local_rank() const override { return env_->local_rank(); }
  int64_t node_rank() const override { return env_->node_rank(); }

  void setup_environment() override;
  void teardown() override;
  void teardown_after_error() override;

  torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op) override;
  void barrier() override;
  torch::Tensor broadcast(const torch::Tensor& tensor, int64_t src) override;
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override;

  // Null before setup_environment() and after teardown.
  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const;

  // An optimizer split over the ranks (shard_, ZeRO-1 or fsdp) is clipped over every rank's part
  // and saved in one process's layout; any other goes to Strategy's defaults.
  torch::Tensor clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                    torch::optim::Optimizer& optimizer, double max_norm,
                                    double norm_type) override;
  void clip_gradients_value(const std::vector<torch::Tensor>& parameters,
                            torch::optim::Optimizer& optimizer, double clip_value) override;

  // ShardedState: the split optimizer's pieces (ZeRO-1; fsdp adds its parameters'). Non-null only
  // while an optimizer is split.
  ShardedState* sharded_state() override { return shard_ ? this : nullptr; }
  std::optional<c10::IValue> gather_optimizer_state(torch::optim::Optimizer& optimizer) override;
  std::optional<std::function<void()>> prepare_split_optimizer_state(
      torch::optim::Optimizer& optimizer, const c10::IValue& state,
      const std::string& source) override;
  std::optional<std::vector<std::vector<std::string>>> optimizer_parameter_names(
      const torch::optim::Optimizer& optimizer) override;
  std::optional<PieceRange> wanted_optimizer_piece(
      const torch::optim::Optimizer& optimizer, const std::string& path, at::IntArrayRef sizes,
      at::IntArrayRef strides, const std::optional<PieceLayout>& layout) override;
  std::optional<c10::IValue> local_optimizer_state(torch::optim::Optimizer& optimizer) override;

 protected:
  // `options.cuda` and `cuda_device` are taken from `device`.
  ParallelStrategy(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
                   std::unique_ptr<Precision> precision, distributed::RendezvousOptions options);
  // Drops what uses the process group (hooks, buffers) before the rendezvous ends.
  virtual void release() {}
  // The process group; throws fabric::Error naming `what` before setup_environment().
  const c10::intrusive_ptr<c10d::ProcessGroup>& group_for(const std::string& what) const;
  // The group gradients are averaged and parameters sharded over: the world's, or under
  // model_parallel its data-parallel dimension's.
  virtual const c10::intrusive_ptr<c10d::ProcessGroup>& data_parallel_group(
      const std::string& what) const {
    return group_for(what);
  }
  // The rendezvous (null before setup_environment() and after teardown).
  const distributed::Rendezvous* rendezvous() const { return rendezvous_.get(); }
  // The split optimizer when it is `optimizer`, else null.
  OptimizerShard* shard_of(const torch::optim::Optimizer& optimizer) const;
  // Under 16-mixed every rank skips the same steps: the GradScaler's found_inf is all-reduced
  // (max) before it decides (a split optimizer's ranks see different gradients).
  void agree_on_found_inf();

  std::shared_ptr<ClusterEnvironment> env_;
  torch::Device device_;
  std::unique_ptr<OptimizerShard> shard_;  // the split optimizer (after setup_optimizer)

 private:
  distributed::RendezvousOptions options_;
  std::unique_ptr<distributed::Rendezvous> rendezvous_;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_PARALLEL_H_
