#include "strategies/collectives.h"

#include <torch/types.h>

#include <cstring>

#include "fabric/core/error.h"
#include "strategies/strategy.h"

namespace fabric {

std::string broadcast_string(Strategy& strategy, const std::string& bytes, int64_t src) {
  if (strategy.world_size() == 1) return bytes;
  auto size = strategy.broadcast(torch::tensor(static_cast<int64_t>(bytes.size())), src);
  auto buffer = torch::empty({size.item<int64_t>()}, torch::kUInt8);
  if (strategy.global_rank() == src) std::memcpy(buffer.data_ptr(), bytes.data(), bytes.size());
  buffer = strategy.broadcast(buffer, src);
  return std::string(static_cast<const char*>(buffer.data_ptr()),
                     static_cast<size_t>(buffer.numel()));
}

std::vector<torch::Tensor> all_gather_padded(Strategy& strategy, const torch::Tensor& tensor) {
  if (strategy.world_size() == 1) return {tensor};
  if (tensor.dim() == 0) return strategy.all_gather(tensor);
  // Shapes first (dimension count padded to 8 + dtype), then the data padded to the longest.
  constexpr int64_t kMaxDims = 8;
  if (tensor.dim() > kMaxDims) throw Error("all_gather: at most 8 dimensions are supported");
  auto shape = torch::full({kMaxDims + 2}, -1, torch::kLong);
  shape[0] = static_cast<int64_t>(tensor.scalar_type());
  shape[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) shape[d + 2] = tensor.size(d);
  const auto shapes = strategy.all_gather(shape.to(strategy.root_device()));
  int64_t longest = 0;
  for (size_t r = 0; r < shapes.size(); ++r) {
    const auto theirs = shapes[r].cpu();
    if (!torch::equal(theirs.narrow(0, 0, 2), shape.narrow(0, 0, 2)) ||
        !torch::equal(theirs.narrow(0, 3, kMaxDims - 1), shape.narrow(0, 3, kMaxDims - 1))) {
      throw Error("all_gather: rank " + std::to_string(strategy.global_rank()) + " and rank " +
                  std::to_string(r) +
                  " disagree on dtype or on a dimension other than the first; only the first "
                  "dimension may differ between ranks");
    }
    longest = std::max(longest, theirs[2].item<int64_t>());
  }
  torch::Tensor padded = tensor;
  if (tensor.size(0) < longest) {
    auto pad_shape = tensor.sizes().vec();
    pad_shape[0] = longest - tensor.size(0);
    padded = torch::cat({tensor, torch::zeros(pad_shape, tensor.options())});
  }
  auto gathered = strategy.all_gather(padded);
  for (size_t r = 0; r < gathered.size(); ++r)
    gathered[r] = gathered[r].narrow(0, 0, shapes[r][2].item<int64_t>());
  return gathered;
}

void on_global_zero(Strategy& strategy, const std::function<void()>& fn) {
  StrategyRanks ranks(strategy);
  on_rank_zero(ranks, fn);
}

int64_t StrategyRanks::rank() const { return strategy_.global_rank(); }
int64_t StrategyRanks::size() const { return strategy_.world_size(); }

std::string StrategyRanks::broadcast_string(const std::string& bytes, int64_t src) {
  return fabric::broadcast_string(strategy_, bytes, src);
}

int64_t StrategyRanks::all_reduce_min(int64_t value) {
  if (strategy_.world_size() == 1) return value;
  // float64 holds every rank number and count exactly.
  const torch::Tensor t = torch::tensor(static_cast<double>(value)).to(strategy_.root_device());
  return static_cast<int64_t>(strategy_.all_reduce(t, ReduceOp::kMin).item<double>());
}

}  // namespace fabric
