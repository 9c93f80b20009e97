// Collectives any strategy offers through its interface (fabric::Strategy's all_reduce,
// broadcast, all_gather), for Fabric, the checkpoint I/O and future strategies alike. Each is
// collective: every rank calls it, in the same order.
#ifndef STRATEGIES_COLLECTIVES_H_
#define STRATEGIES_COLLECTIVES_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fabric/core/rank_group.h"

namespace fabric {

class Strategy;

// `strategy`'s ranks as a RankGroup (for the checkpoint writer, fabric/checkpoint/writer.h).
class StrategyRanks : public RankGroup {
 public:
  explicit StrategyRanks(Strategy& strategy) : strategy_(strategy) {}
  int64_t rank() const override;
  int64_t size() const override;
  std::string broadcast_string(const std::string& bytes, int64_t src) override;
  int64_t all_reduce_min(int64_t value) override;

 private:
  Strategy& strategy_;
};

// Rank `src`'s bytes on every rank.
std::string broadcast_string(Strategy& strategy, const std::string& bytes, int64_t src);

// Every rank's `tensor`, in rank order; the first dimension may differ between ranks (padded on
// the wire), the dtype and other dimensions may not (fabric::Error naming both ranks).
std::vector<torch::Tensor> all_gather_padded(Strategy& strategy, const torch::Tensor& tensor);

// Global rank 0 runs `fn`; then every rank throws fabric::Error with rank 0's error message, if it
// had one, so no rank waits forever for a writer that failed.
void on_global_zero(Strategy& strategy, const std::function<void()>& fn);

}  // namespace fabric

#endif  // STRATEGIES_COLLECTIVES_H_
