// Internal to OptimizerShard (optimizer_shard.cc, optimizer_shard_state.cc): views of flat
// memory and how a tensor is named in errors.
#ifndef STRATEGIES_OPTIMIZER_SHARD_DETAIL_H_
#define STRATEGIES_OPTIMIZER_SHARD_DETAIL_H_

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace fabric::strategies::detail {

// `length` elements of `t`'s memory from its first element + `begin`, as a 1-D tensor of its own
// (no autograd view relation: Optimizer::zero_grad may detach_() it).
inline torch::Tensor alias(const torch::Tensor& t, int64_t begin, int64_t length) {
  torch::NoGradGuard no_grad;
  return torch::empty({0}, t.options())
      .set_(t.storage(), t.storage_offset() + begin, {length}, {1});
}

inline std::string describe(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " [" + std::to_string(t.numel()) + "]";
}

}  // namespace fabric::strategies::detail

#endif  // STRATEGIES_OPTIMIZER_SHARD_DETAIL_H_
