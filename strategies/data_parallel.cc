#include "strategies/data_parallel.h"

#include <torch/types.h>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "fabric/core/error.h"

namespace fabric::strategies {

DataParallel::DataParallel(std::vector<torch::Device> devices, std::unique_ptr<Precision> precision)
    : Strategy(std::move(precision)), devices_(std::move(devices)) {
  if (devices_.empty()) throw Error("dp: no devices");
}

void DataParallel::setup_environment() {
#ifdef FABRIC_WITH_CUDA
  if (devices_.front().is_cuda()) c10::cuda::set_device(devices_.front().index());
#endif
}

void DataParallel::setup_module(torch::nn::Module& module) {
  materialize_empty_init(module, devices_.front());
  module.to(devices_.front());
  convert_module(module);
}

torch::Tensor DataParallel::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  (void)op;
  return tensor;  // one process
}

torch::Tensor DataParallel::broadcast(const torch::Tensor& tensor, int64_t src) {
  if (src != 0)
    throw Error("broadcast: src " + std::to_string(src) + " does not exist (world size 1)");
  return tensor;
}

}  // namespace fabric::strategies
