// fabric::distributed::ShmSegment: the all-reduce, reduce-scatter and all-gather over one /dev/shm
// segment shared by the ranks of one machine, as run by the shared-memory backend's worker thread
// (shm_backend.h describes the algorithm and guarantees). Layout: a header (barrier counters, futex
// word), then one chunk per rank, then two result chunks used in alternate rounds.
#ifndef FABRIC_DISTRIBUTED_SHM_SEGMENT_H_
#define FABRIC_DISTRIBUTED_SHM_SEGMENT_H_

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace fabric::distributed {

class ShmSegment {
 public:
  // Bytes of a segment for `world` ranks with `chunk_bytes` per rank and round.
  static int64_t size(int64_t world, int64_t chunk_bytes);
  // Creates (`create`: exclusively) or opens /dev/shm<name> of `bytes` and maps it into *base.
  // "" on success, else why not (a created file is removed again then).
  static std::string map(const std::string& name, bool create, int64_t bytes, void** base);
  // Takes over a mapping of size(world, chunk_bytes) bytes; unmapped on destruction.
  static std::unique_ptr<ShmSegment> adopt(void* base, int64_t rank, int64_t world,
                                           int64_t chunk_bytes, std::chrono::milliseconds timeout);

  virtual ~ShmSegment() = default;
  // Wakes an all_reduce waiting for the other ranks; it then fails.
  virtual void stop() = 0;
  // Reduces `tensor` in place with every rank's (same shape and dtype, same call order); throws
  // fabric::Error after `timeout` without the others, or once another rank gave up.
  virtual void all_reduce(const at::Tensor& tensor, c10d::ReduceOp::RedOpType op) = 0;
  // `out` (k elements) = the reduction, in rank order, of every rank's elements [rank * k,
  // (rank + 1) * k) of `in` (world * k elements, the same dtype). Same guarantees as all_reduce;
  // the result equals that slice of all_reduce(in) bit for bit.
  virtual void reduce_scatter(const at::Tensor& out, const at::Tensor& in,
                              c10d::ReduceOp::RedOpType op) = 0;
  // `out` (world * k elements) = every rank's `in` (k elements, the same dtype), in rank order.
  virtual void all_gather(const at::Tensor& out, const at::Tensor& in) = 0;
};

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_SHM_SEGMENT_H_
