// fabric::RankGroup: the job's ranks as the packages below the strategies see them: who this rank
// is, and the two collectives that writing a checkpoint from every rank needs. A Strategy is one
// (strategies/collectives.h: StrategyRanks); a single process is SingleRank.
#ifndef FABRIC_CORE_RANK_GROUP_H_
#define FABRIC_CORE_RANK_GROUP_H_

#include <cstdint>
#include <functional>
#include <string>

namespace fabric {

class RankGroup {
 public:
  virtual ~RankGroup() = default;
  virtual int64_t rank() const = 0;
  virtual int64_t size() const = 0;
  // Rank `src`'s bytes on every rank. Collective.
  virtual std::string broadcast_string(const std::string& bytes, int64_t src) = 0;
  // The smallest of every rank's `value`, on every rank. Collective.
  virtual int64_t all_reduce_min(int64_t value) = 0;
};

// One process.
class SingleRank : public RankGroup {
 public:
  int64_t rank() const override { return 0; }
  int64_t size() const override { return 1; }
  std::string broadcast_string(const std::string& bytes, int64_t) override { return bytes; }
  int64_t all_reduce_min(int64_t value) override { return value; }
};

// Rank 0 runs `fn`; then every rank throws fabric::Error with rank 0's message, if it failed, so
// that no rank waits forever for a writer that failed. Collective.
void on_rank_zero(RankGroup& ranks, const std::function<void()>& fn);

// Every rank's `failure` ("" where it succeeded) → the lowest failing rank's, on every rank (""
// when none failed). Collective.
std::string first_failure(RankGroup& ranks, const std::string& failure);

}  // namespace fabric

#endif  // FABRIC_CORE_RANK_GROUP_H_
