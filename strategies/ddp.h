// fabric::strategies::Ddp: data-parallel training over c10d with PyTorch's own c10d::Reducer
// (bucketed all-reduce launched from gradient-ready hooks, so communication overlaps backward).
//
// Lifecycle: setup_environment() joins the rendezvous (strategies/parallel.h: store, self-launch,
// process group, heartbeat). setup_module() moves and converts the module, checks that every
// rank has the same parameter shapes, broadcasts parameters and buffers from rank 0 and builds the
// module's Reducer. backward() prepares the Reducer (unless inside no_backward_sync) and runs the
// precision's backward; optimizer_step() steps and, with broadcast_buffers, re-broadcasts buffers
// for the next forward. Gradients are averaged over the world.
//
// Several modules (a GAN's generator and discriminator, a student beside a frozen teacher) are set
// up each on its own, as torch's DistributedDataParallel wraps each: every module with parameters
// that require gradients gets its own Reducer, and a backward synchronizes the modules its loss
// reaches (found from the autograd graph, so a discriminator step on a detached fake leaves the
// generator alone); a module the loss reaches only in part needs find_unused_parameters (an error
// naming a parameter it does not reach, before the backward). A frozen module (no parameter
// requires a gradient) is moved and converted, never broadcast or synchronized (every rank builds
// it with the same seed or loads the same weights).
// shard_optimizer_state, static_graph and capturable gradient sync take one trainable module.
//
// Selected by the Connector for fabric.strategy: ddp, or auto with more than one process.
#ifndef STRATEGIES_DDP_H_
#define STRATEGIES_DDP_H_

#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
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

  // Each module its own Reducer (above); a frozen one none.
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
  // A module set up with parameters that require gradients, and what synchronizes them.
  struct Replica;

  void release() override;  // the Reducers and the flat syncs, before the rendezvous ends
  void broadcast_buffers();
  void make_reducer(Replica& r);  // over its parameters (hooks synchronize during backward)
  // The replicas `loss` reaches through the autograd graph on any rank (the one there is: no graph
  // walk, no collective; several: one small all-reduce, so that every rank makes the same
  // choice); `uneven`: some replica is reached on some ranks more than on others. Refuses, on
  // every rank, one some rank's loss reaches in part without find_unused_parameters, and a
  // parameter of a module set up frozen that now requires a gradient.
  std::vector<Replica*> reached_by(const torch::Tensor& loss, bool* uneven);

  DdpOptions options_;
  std::vector<std::unique_ptr<Replica>> replicas_;  // in setup order
  int modules_set_up_ = 0;                          // frozen ones included (errors name them)
  std::unordered_set<const void*> synchronized_;    // the replicas' parameters (no sharing)
  std::vector<std::pair<torch::Tensor, std::string>> frozen_;  // frozen modules' parameters
  bool capturable_ = false;
  std::vector<torch::Tensor> buffers_;  // of the replicas, re-broadcast after each step
  bool sync_ = true;
  bool unsynced_ = false;  // a backward inside no_backward_sync since the last synchronization
  int64_t synced_backwards_ = 0;
  int64_t sync_batchnorm_modules_ = 0;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_DDP_H_
