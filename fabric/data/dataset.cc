#include "fabric/data/dataset.h"

#include <torch/types.h>

#include "fabric/core/error.h"

namespace fabric {

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (data_.size(0) != target_.size(0)) {
    throw Error("TensorDataset: data has " + std::to_string(data_.size(0)) +
                " rows but target has " + std::to_string(target_.size(0)));
  }
  if (data_.device() != target_.device()) {
    throw Error("TensorDataset: data is on " + data_.device().str() + " but target on " +
                target_.device().str());
  }
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  auto index = torch::tensor(indices, torch::kLong);
  if (!data_.is_cpu()) index = index.pin_memory().to(data_.device(), /*non_blocking=*/true);
  return {data_.index_select(0, index), target_.index_select(0, index)};
}

}  // namespace fabric
