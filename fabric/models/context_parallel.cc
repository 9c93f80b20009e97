#include "fabric/models/context_parallel.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/nn/ring_attention.h"

namespace fabric::models {

torch::Tensor context_parallel_positions(const ContextParallelGroup& cp, int64_t local,
                                         const torch::Device& device) {
  const int64_t size = cp.group->getSize();
  return torch::tensor(fabric::nn::cp_rank_positions(local * size, size, cp.group->getRank()),
                       torch::TensorOptions().dtype(torch::kLong))
      .to(device);
}

}  // namespace fabric::models
