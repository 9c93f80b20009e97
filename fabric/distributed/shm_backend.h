// fabric::distributed: a c10d backend whose all-reduces go through shared memory when every rank
// runs on one machine (fabric.ddp.cpu_backend: auto | shm), instead of Gloo's loopback TCP.
//
// make_shm_backend() wraps the Gloo backend. An all_reduce of one CPU tensor (SUM, MIN, MAX or
// PRODUCT; any numeric dtype) runs, in issue order, on one worker thread through a segment shared
// by all ranks: chunk by chunk, each rank copies its chunk in, reduces its 1/N share of the chunk
// over every rank's copy (rank 0 + rank 1 + ... in that order) into a result area, and copies the
// reduced chunk out; two process-shared barriers (futexes) per chunk. Reduce-scatter
// (_reduce_scatter_base: every rank publishes its piece for every destination, each reduces its
// own in rank order) and all-gather (_allgather_base, and the list form with one input) run the
// same way, in the same queue, without a full all-reduce: what sharded training exchanges. Every
// other collective (broadcast, barrier, gather, ...) goes to Gloo unchanged.
//
// The result is the same on every rank and does not depend on timing, so runs repeat bitwise. For
// two ranks it equals Gloo's bitwise (a + b == b + a); for more ranks the summation order differs
// from Gloo's ring, so the last bits may too.
//
// The ranks agree through the store whether they can share the segment: rank 0 creates it in
// /dev/shm, every other rank opens it and reports. If any rank cannot (another machine, no
// /dev/shm, too little space), make_shm_backend() returns nullptr on every rank and the caller
// keeps Gloo. The segment's name is removed as soon as every rank has mapped it, so a job that dies
// leaves nothing behind in /dev/shm.
//
// A rank that waits longer than `timeout` for the others fails that all_reduce (and every later
// one) with an error naming the wait; destroying the backend wakes a waiting worker at once.
#ifndef FABRIC_DISTRIBUTED_SHM_BACKEND_H_
#define FABRIC_DISTRIBUTED_SHM_BACKEND_H_

#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace fabric::distributed {

struct ShmBackendOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::chrono::milliseconds timeout{300000};
  // Bytes per rank and chunk; the segment holds world_size + 2 chunks. 256 KiB keeps a chunk's
  // working set in cache: a 19 MB all-reduce of 2 ranks took 1.1-1.3 ms with it, 2.1 ms with 4 MiB
  // (//tools/bench:allreduce, docs/benchmarks.md).
  int64_t chunk_bytes = int64_t{256} << 10;
  // Store keys are "<key_prefix>/..."; every rank must pass the same prefix.
  std::string key_prefix = "fabric_shm";
};

// nullptr (on every rank) when the ranks cannot share memory. `why_not`, if given, receives the
// reason then (e.g. "rank 1 cannot open /fabricpp-...: No such file or directory").
c10::intrusive_ptr<c10d::Backend> make_shm_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                   c10::intrusive_ptr<c10d::Backend> fallback,
                                                   const ShmBackendOptions& options,
                                                   std::string* why_not = nullptr);

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_SHM_BACKEND_H_
