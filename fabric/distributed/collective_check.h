// Hang diagnosis for the collectives Fabric issues (all_reduce, broadcast, all_gather, barrier):
//   describe(): "all_reduce #17 (float32 [4])", used in every timeout error, so each rank says
//     which collective it was in (kind, sequence number, dtype and shape);
//   CollectiveChecker (fabric.ddp.debug_collectives: true): before each collective every rank
//     publishes its description in the store and compares it with rank 0's (rank 0 with every
//     rank's), failing at the first divergence with both sides named, e.g.
//       collective #3 differs between ranks: rank 0 calls all_reduce float32 [4], rank 1 calls
//       broadcast float32 [4] (fabric.ddp.debug_collectives)
//     instead of hanging until fabric.ddp.timeout_s. Costs one store round trip per collective
//     (rank 0: one per rank): a debugging mode, off by default.
#ifndef FABRIC_DISTRIBUTED_COLLECTIVE_CHECK_H_
#define FABRIC_DISTRIBUTED_COLLECTIVE_CHECK_H_

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace c10d {
class Store;
}

namespace fabric::distributed {

// "all_reduce float32 [4]" (no tensor: just the kind).
std::string collective_signature(const std::string& kind, const at::Tensor* tensor);

class CollectiveChecker {
 public:
  CollectiveChecker(c10::intrusive_ptr<c10d::Store> store, int64_t rank, int64_t world_size,
                    std::chrono::milliseconds timeout);
  // Throws fabric::Error when collective `seq` has another signature on some rank, or when a rank
  // does not reach it within the timeout.
  void check(int64_t seq, const std::string& signature);

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int64_t rank_, world_size_;
  std::chrono::milliseconds timeout_;
};

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_COLLECTIVE_CHECK_H_
