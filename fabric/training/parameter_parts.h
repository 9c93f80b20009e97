// fabric::ParameterParts: the part of a module's parameters this process holds and updates, for
// code that keeps a per-parameter copy beside the optimizer (fabric::ExponentialMovingAverage).
// Under single device, dp and ddp every part is a whole parameter; under fsdp each rank holds a
// contiguous run of each parameter's elements (ranks in order, together every element once); under
// model_parallel a run of the elements in the order of the tensor-parallel slices.
// Fabric::parameter_parts(module) gives them after setup.
#ifndef FABRIC_TRAINING_PARAMETER_PARTS_H_
#define FABRIC_TRAINING_PARAMETER_PARTS_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fabric/checkpoint/piece_layout.h"

namespace fabric {

// Elements [offset, offset + values.numel()) of parameter `name` (shape `sizes`, contiguous), in
// the order `layout` gives them when it has one (model_parallel's slices).
struct ParameterPart {
  std::string name;      // as named_parameters() names it
  torch::Tensor values;  // 1-D when split (may be empty); aliases the memory the optimizer updates
  std::vector<int64_t> sizes;
  int64_t offset = 0;
  bool split = false;  // the same on every rank
  std::optional<PieceLayout> layout = std::nullopt;
  // False where another rank holds the same elements and a sharded checkpoint takes them from it
  // (model_parallel: a parameter not split over tp, on tp ranks after the first).
  bool written = true;
};

struct ParameterParts {
  std::vector<ParameterPart> parts;  // the floating-point parameters, in module order
  // Call after writing to the parts other than through the optimizer: drops copies of the
  // parameters gathered from the old values. Empty when nothing needs it.
  std::function<void()> changed;
  // Collective (every rank, same order): the whole tensor of split part i from every rank's
  // `part` (a tensor shaped as parts[i].values). Empty when nothing is split.
  std::function<torch::Tensor(const torch::Tensor& part, size_t i)> gather;
};

}  // namespace fabric

#endif  // FABRIC_TRAINING_PARAMETER_PARTS_H_
