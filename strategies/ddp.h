// fabric::strategies::Ddp: data-parallel training over c10d with PyTorch's own c10d::Reducer
// (bucketed all-reduce launched from gradient-ready hooks, so communication overlaps backward).
//
// Lifecycle: setup_environment() joins the rendezvous (strategies/parallel.h: store, self-launch,
// process group, heartbeat). setup_module() moves and converts the module, checks that every
// rank has the same parameter shapes, broadcasts parameters and buffers from rank 0 and builds the
// Reducer. backward() prepares the Reducer (unless inside no_backward_sync) and runs the
// precision's backward; optimizer_step() steps and, with broadcast_buffers, re-broadcasts buffers
// for the next forward. Gradients are averaged over the world.
//
// Selected by the Connector for fabric.strategy: ddp, or auto with more than one process.
#ifndef STRATEGIES_DDP_H_
#define STRATEGIES_DDP_H_

#include <memory>
#include <string>
#include <vector>

#include "fabric/core/cluster_environment.h"
#include "strategies/ddp_options.h"
#include "strategies/parallel.h"

namespace c10d {
class Reducer;
}  // namespace c10d

namespace fabric::strategies {

class FlatGradientSync;

class Ddp : public ParallelStrategy {
 public:
  // `argv`: the command line to re-execute for self-launched ranks.
  Ddp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
      std::unique_ptr<Precision> precision, DdpOptions options, std::vector<std::string> argv);
  ~Ddp() override;

  std::string name() const override { return "ddp"; }

  // One module per process: a second is refused (its Reducer would replace the first's, whose
  // gradients would then go unsynchronized); put the modules in one torch::nn::Module.
  void setup_module(torch::nn::Module& module) override;
  // With shard_optimizer_state: splits `optimizer`'s parameters over the ranks (one optimizer;
  // after setup_module). Otherwise nothing.
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  void backward(const torch::Tensor& loss) override;
  bool optimizer_step(torch::optim::Optimizer& optimizer) override;
  // Averages the gradients of backward passes inside no_backward_sync that no synchronized
  // backward followed (the flat sync, or the optimizer shard's reduce-scatter).
  void sync_unsynced_gradients() override;
  ScopeGuard no_backward_sync() override;
  // On: backward averages the gradients after the backward pass through FlatGradientSync
  // (capturable in a CUDA graph, NCCL included) instead of by the Reducer's hooks during it.
  void set_capturable_gradient_sync(bool on) override;

  // Backward passes that synchronized gradients since setup_module.
  int64_t synced_backward_passes() const { return synced_backwards_; }
  // BatchNorm modules synchronizing across ranks after setup_module (fabric.sync_batchnorm).
  int64_t sync_batchnorm_modules() const { return sync_batchnorm_modules_; }

 private:
  void release() override;  // the Reducer and the flat sync, before the rendezvous ends
  void broadcast_buffers();
  void make_reducer();  // over params_ (the Reducer's hooks synchronize during backward)

  DdpOptions options_;
  std::vector<torch::Tensor> params_;  // those that require gradients, in module order
  std::vector<std::string> param_names_;
  std::shared_ptr<c10d::Reducer> reducer_;  // none while capturable_
  std::unique_ptr<FlatGradientSync> flat_sync_;
  bool capturable_ = false;
  int64_t reducer_backwards_ = 0;  // backward passes synchronized by the Reducer
  std::vector<torch::Tensor> buffers_;
  bool sync_ = true;
  bool unsynced_ = false;  // a backward inside no_backward_sync since the last synchronization
  int64_t synced_backwards_ = 0;
  int64_t sync_batchnorm_modules_ = 0;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_DDP_H_
