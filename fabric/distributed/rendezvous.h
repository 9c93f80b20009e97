// fabric::distributed::Rendezvous: what every multi-process strategy needs before its first
// collective, and the end of it, in one piece (DDP uses it through strategies::ParallelStrategy; a
// sharding strategy reuses it unchanged).
//
// Joining (the constructor), for the job described by a ClusterEnvironment:
//   1. the rendezvous store (make_store): rank 0 hosts it (on loopback when the job is on one
//      machine, every interface otherwise), the others connect; under torchrun's agent store
//      every rank is a client;
//   2. a self-launched job (no external launcher): rank 0 binds an ephemeral port and starts the
//      other ranks (fabric/launchers/subprocess_launcher.h), which learn it from
//      FABRIC_MASTER_PORT;
//   3. the process group (make_process_group: Gloo or shared memory for CPU tensors, NCCL for
//      CUDA ones);
//   4. with debug_collectives, a CollectiveChecker; in a job started by an external launcher or the
//      restart agent (fabric/distributed/restart_agent.h: it hosts the store, so step 2 is skipped)
//      with heartbeat_timeout > 0, a Heartbeat that ends this rank (exit status 1, one error line
//      naming the silent rank) when another stops beating.
// Collectives of the user-facing API announce themselves with begin_collective(), which numbers
// them (every timeout error names "all_reduce(sum) #3 (float32 [4])") and checks them across ranks.
// finish() ends a job that went well; end_after_error() one whose rank failed.
//
// Thread-safety: used from the thread that runs Fabric::launch.
#ifndef FABRIC_DISTRIBUTED_RENDEZVOUS_H_
#define FABRIC_DISTRIBUTED_RENDEZVOUS_H_

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fabric/core/cluster_environment.h"
#include "fabric/distributed/process_group.h"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace fabric {
class SubprocessLauncher;
}  // namespace fabric

namespace fabric::distributed {

class CollectiveChecker;
class Heartbeat;

struct RendezvousOptions {
  std::chrono::milliseconds timeout{300000};  // store, process group and every collective
  // Jobs started by an external launcher (0: off): see Heartbeat.
  std::chrono::milliseconds heartbeat_timeout{5000};
  bool debug_collectives = false;  // CollectiveChecker on every collective of the API
  bool cuda = false;               // this process computes on CUDA device `cuda_device`
  int64_t cuda_device = 0;
  bool cuda_with_gloo = false;  // Gloo instead of NCCL for CUDA tensors
  CpuBackend cpu_backend = CpuBackend::kAuto;
  std::vector<std::string> argv;  // the command line self-launched ranks re-execute
};

class Rendezvous {
 public:
  // Steps 1-4 above. Throws fabric::Error naming the address, port and cause when the store
  // cannot be reached or the process group cannot be built.
  Rendezvous(std::shared_ptr<ClusterEnvironment> environment, RendezvousOptions options);
  ~Rendezvous();
  Rendezvous(const Rendezvous&) = delete;
  Rendezvous& operator=(const Rendezvous&) = delete;

  const c10::intrusive_ptr<c10d::ProcessGroup>& process_group() const { return pg_; }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // The settings the world's group was made with (for groups over subsets of it: DeviceMesh).
  const ProcessGroupOptions& group_options() const { return group_options_; }

  // Counts one collective of the API (kind e.g. "all_reduce(sum)"; tensor may be null), checks
  // it across ranks under debug_collectives (throws fabric::Error at the first divergence), and
  // returns its description for errors: "all_reduce(sum) #17 (float32 [4])".
  std::string begin_collective(const std::string& kind, const at::Tensor* tensor);

  // The job went well on this rank: waits for every rank (nobody leaves while others still need
  // rank 0's store), stops the heartbeat, shuts the process group down and, on rank 0 of a
  // self-launched job, waits for the other ranks.
  void finish();
  // This rank failed: tells the heartbeat's peers, stops the self-launched ranks and aborts
  // pending communication. Never waits for other ranks; never throws.
  void end_after_error();

 private:
  std::shared_ptr<ClusterEnvironment> env_;
  RendezvousOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  ProcessGroupOptions group_options_;
  std::unique_ptr<SubprocessLauncher> launcher_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<CollectiveChecker> checker_;
  int64_t collectives_ = 0;
};

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_RENDEZVOUS_H_
