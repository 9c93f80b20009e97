#include "strategies/single_device.h"

#include <torch/types.h>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "fabric/core/error.h"

namespace fabric::strategies {

SingleDevice::SingleDevice(torch::Device device, std::unique_ptr<Precision> precision)
    : Strategy(std::move(precision)), device_(device) {}

void SingleDevice::setup_environment() {
#ifdef FABRIC_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::set_device(device_.index());
#endif
}

void SingleDevice::setup_module(torch::nn::Module& module) {
  // Module::to uses set_data, so optimizers built before setup keep valid parameter references.
  materialize_empty_init(module, device_);
  module.to(device_);
  convert_module(module);
}

torch::Tensor SingleDevice::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  (void)op;
  return tensor;
}

torch::Tensor SingleDevice::broadcast(const torch::Tensor& tensor, int64_t src) {
  if (src != 0)
    throw Error("broadcast: src " + std::to_string(src) + " does not exist (world size 1)");
  return tensor;
}

}  // namespace fabric::strategies
