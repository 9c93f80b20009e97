// fabric::strategies::DataParallel (fabric.strategy: dp): one process drives several CUDA devices.
// Each Fabric::forward(model, input) scatters the batch along dimension 0 over the devices, runs a
// replica of the model on each (torch::nn::parallel::data_parallel) and gathers the outputs on the
// first device, where the parameters, gradients and optimizer live (fabric/nn/data_parallel.h:
// one thread per replica under the caller's autocast state; BatchNorm running statistics become
// the replicas' mean in the module).
//
// Limits (as PyTorch's DataParallel, which DDP supersedes): the model must be Cloneable
// (torch::nn::Cloneable<Impl>) and called through Fabric::forward; the model is copied to every
// device at every forward, so it scales worse than ddp. The Connector selects it only with 2 or
// more CUDA devices; otherwise dp falls back to single_device with a one-line warning.
#ifndef STRATEGIES_DATA_PARALLEL_H_
#define STRATEGIES_DATA_PARALLEL_H_

#include <vector>

#include "strategies/strategy.h"

namespace fabric::strategies {

class DataParallel : public Strategy {
 public:
  DataParallel(std::vector<torch::Device> devices, std::unique_ptr<Precision> precision);

  std::string name() const override { return "dp"; }
  torch::Device root_device() const override { return devices_.front(); }
  const std::vector<torch::Device>* replica_devices() const override { return &devices_; }
  void setup_environment() override;
  void setup_module(torch::nn::Module& module) override;
  torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op) override;
  torch::Tensor broadcast(const torch::Tensor& tensor, int64_t src) override;

 private:
  std::vector<torch::Device> devices_;
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_DATA_PARALLEL_H_
