// What the sharded-checkpoint tests share (sharded_test, sharded_slices_test): a tensor's
// elements as a piece, the shard dicts of split parts, and the error joining them gives.
#ifndef TESTS_FABRIC_CHECKPOINT_SHARDED_TESTING_H_
#define TESTS_FABRIC_CHECKPOINT_SHARDED_TESTING_H_

#include <torch/types.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"

namespace fabric::sharded_testing {

// `t`'s memory elements [begin, end) as a piece.
inline c10::IValue piece(const torch::Tensor& t, int64_t begin, int64_t end) {
  const int64_t n = t.numel();
  torch::Tensor flat = t.as_strided({n}, {1}, t.storage_offset());
  begin = std::min(begin, n);
  end = std::min(end, n);
  return fabric::tensor_piece(
      t.sizes(), t.strides(), begin < end ? begin : 0,
      begin < end ? flat.narrow(0, begin, end - begin) : torch::empty({0}, t.options()));
}

inline std::vector<c10::IValue> shards_of(const std::vector<fabric::ShardedParts>& parts) {
  std::vector<c10::IValue> out;
  for (const auto& p : parts) out.push_back(p.shard);
  return out;
}

inline std::string join_error(const c10::IValue& common, const std::vector<c10::IValue>& shards) {
  try {
    fabric::join_pieces(common, shards, "ckpt");
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace fabric::sharded_testing

#endif  // TESTS_FABRIC_CHECKPOINT_SHARDED_TESTING_H_
