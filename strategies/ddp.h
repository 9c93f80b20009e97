// fabric::strategies::Ddp: data-parallel training over c10d with PyTorch's own c10d::Reducer
// (bucketed all-reduce launched from gradient-ready hooks, so communication overlaps backward).
//
// Lifecycle: setup_environment() connects to (rank 0: hosts) the rendezvous store and builds the
// process group; in a self-launched job rank 0 hosts the store on an ephemeral port and starts the
// other ranks (SubprocessLauncher). setup_module() moves and converts the module, checks that every
// rank has the same parameter shapes, broadcasts parameters and buffers from rank 0 and builds the
// Reducer. backward() prepares the Reducer (unless inside no_backward_sync) and runs the
// precision's backward; optimizer_step() steps and, with broadcast_buffers, re-broadcasts buffers
// for the next forward. Gradients are averaged over the world.
//
// Selected by the Connector for fabric.strategy: ddp, or auto with more than one process.
#ifndef STRATEGIES_DDP_H_
#define STRATEGIES_DDP_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fabric/core/cluster_environment.h"
#include "strategies/strategy.h"

namespace c10d {
class ProcessGroup;
class Reducer;
class Store;
}  // namespace c10d

namespace fabric {
class SubprocessLauncher;
namespace distributed {
class CollectiveChecker;
class Heartbeat;
}  // namespace distributed
}  // namespace fabric

namespace fabric::strategies {
class FlatGradientSync;
}  // namespace fabric::strategies

namespace fabric::strategies {

struct DdpOptions {
  double bucket_cap_mb = 25.0;           // fabric.ddp.bucket_cap_mb
  bool find_unused_parameters = false;   // fabric.ddp.find_unused_parameters
  bool broadcast_buffers = true;         // fabric.ddp.broadcast_buffers
  bool gradient_as_bucket_view = false;  // fabric.ddp.gradient_as_bucket_view
  bool static_graph = false;             // fabric.ddp.static_graph
  std::string comm_hook = "none";        // none | fp16 | bf16
  bool sync_batchnorm = false;           // fabric.sync_batchnorm
  bool cuda_with_gloo = false;  // Gloo instead of NCCL for CUDA tensors (ranks may share a GPU)
  // fabric.ddp.cpu_backend: auto | gloo | shm (fabric/distributed/shm_backend.h). auto: CPU
  // all-reduces through shared memory when every rank can map it (one machine), else Gloo.
  std::string cpu_backend = "auto";
  std::chrono::milliseconds timeout{300000};  // fabric.ddp.timeout_s
  // fabric.ddp.heartbeat_timeout_s (0: off). Jobs started by an external launcher: a rank that
  // stops beating for this long (killed, crashed, frozen) ends every other rank with an error
  // naming it (fabric/distributed/heartbeat.h). Self-launched jobs have the launcher for that.
  std::chrono::milliseconds heartbeat_timeout{5000};
  // fabric.ddp.debug_collectives: check through the store that every rank issues the same
  // collectives (kind, dtype, shape) in the same order; fail at the first divergence.
  bool debug_collectives = false;
};

class Ddp : public Strategy {
 public:
  // `argv`: the command line to re-execute for self-launched ranks.
  Ddp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
      std::unique_ptr<Precision> precision, DdpOptions options, std::vector<std::string> argv);
  ~Ddp() override;

  std::string name() const override { return "ddp"; }
  torch::Device root_device() const override { return device_; }
  int64_t world_size() const override { return env_->world_size(); }
  int64_t global_rank() const override { return env_->global_rank(); }
  int64_t local_rank() const override { return env_->local_rank(); }
  int64_t node_rank() const override { return env_->node_rank(); }

  void setup_environment() override;
  void teardown() override;
  void teardown_after_error() override;
  void setup_module(torch::nn::Module& module) override;
  void backward(const torch::Tensor& loss) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer) override;
  torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op) override;
  void barrier() override;
  torch::Tensor broadcast(const torch::Tensor& tensor, int64_t src) override;
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor) override;
  ScopeGuard no_backward_sync(torch::nn::Module& module) override;
  // On: backward averages the gradients after the backward pass through FlatGradientSync
  // (capturable in a CUDA graph, NCCL included) instead of by the Reducer's hooks during it.
  void set_capturable_gradient_sync(bool on) override;

  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }
  // Backward passes that synchronized gradients since setup_module.
  int64_t synced_backward_passes() const { return synced_backwards_; }
  // BatchNorm modules synchronizing across ranks after setup_module (fabric.sync_batchnorm).
  int64_t sync_batchnorm_modules() const { return sync_batchnorm_modules_; }

 private:
  void broadcast_buffers();
  void make_reducer();  // over params_ (the Reducer's hooks synchronize during backward)
  // Counts a collective of Fabric's API; checks it across ranks under debug_collectives; returns
  // its description for errors: "all_reduce(sum) #17 (float32 [4])".
  std::string begin_collective(const std::string& kind, const torch::Tensor* tensor);

  std::shared_ptr<ClusterEnvironment> env_;
  torch::Device device_;
  DdpOptions options_;
  std::vector<std::string> argv_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::unique_ptr<SubprocessLauncher> launcher_;
  std::unique_ptr<distributed::Heartbeat> heartbeat_;
  std::unique_ptr<distributed::CollectiveChecker> checker_;
  int64_t collectives_ = 0;
  std::vector<torch::Tensor> params_;  // those that require gradients, in module order
  std::vector<std::string> param_names_;
  std::shared_ptr<c10d::Reducer> reducer_;  // none while capturable_
  std::unique_ptr<FlatGradientSync> flat_sync_;
  bool capturable_ = false;
  int64_t reducer_backwards_ = 0;  // backward passes synchronized by the Reducer
  std::vector<torch::Tensor> buffers_;
  bool sync_ = true;
  int64_t synced_backwards_ = 0;
  int64_t sync_batchnorm_modules_ = 0;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_DDP_H_
