#include "fabric/core/rank_group.h"

#include <exception>

#include "fabric/core/error.h"

namespace fabric {

void on_rank_zero(RankGroup& ranks, const std::function<void()>& fn) {
  std::string failure;
  if (ranks.rank() == 0) {
    try {
      fn();
    } catch (const std::exception& e) {
      failure = e.what();
      if (failure.empty()) failure = "global rank 0 failed without a message";
    }
  }
  failure = ranks.broadcast_string(failure, 0);
  if (!failure.empty()) throw Error(failure);
}

std::string first_failure(RankGroup& ranks, const std::string& failure) {
  const int64_t first = ranks.all_reduce_min(failure.empty() ? ranks.size() : ranks.rank());
  if (first >= ranks.size()) return "";
  return ranks.broadcast_string(failure, first);
}

}  // namespace fabric
