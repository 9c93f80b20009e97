// fabric::distributed: rendezvous store and process groups on c10d.
//
// make_store(): rank 0 hosts a c10d::TCPStore, the others connect to it. A store created with
// port 0 binds an ephemeral port (read it back with store_port()), so any number of self-launched
// jobs run side by side without port collisions. make_process_group(): a c10d::ProcessGroup with
// Gloo for CPU tensors (all-reduces through shared memory when every rank is on this machine, see
// ProcessGroupOptions::cpu_backend) and, in CUDA builds when `cuda` is true, NCCL for CUDA tensors
// (both registered, so CPU collectives keep working in GPU jobs). The timeout applies to the store
// and to every collective.
#ifndef FABRIC_DISTRIBUTED_PROCESS_GROUP_H_
#define FABRIC_DISTRIBUTED_PROCESS_GROUP_H_

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Store;
class ProcessGroup;
class Work;
}  // namespace c10d

namespace fabric::distributed {

struct StoreOptions {
  std::string host = "127.0.0.1";  // rank 0's address (and where rank 0 listens)
  int port = 0;                    // 0 (rank 0 only): bind an ephemeral port
  bool is_server = false;          // rank 0 hosts the store
  int64_t world_size = 1;
  std::chrono::milliseconds timeout{300000};
  // Rank 0 only: the address the store accepts connections on. Default loopback: nothing outside
  // this machine can reach it (c10d stores have no authentication). "" = every interface, which
  // a job spanning nodes needs (Ddp sets it then; keep such jobs on a private network).
  std::string listen_address = "127.0.0.1";
  // Every key under this prefix (c10d::PrefixStore) when not empty.
  std::string prefix;
};

// Throws fabric::Error naming host, port and the cause when the store cannot be created/reached.
c10::intrusive_ptr<c10d::Store> make_store(const StoreOptions& options);
// The port a TCPStore listens on (after binding port 0); looks through PrefixStores.
int store_port(const c10::intrusive_ptr<c10d::Store>& store);

// What runs CPU all-reduces (fabric.ddp.cpu_backend): Gloo; shared memory (shm_backend.h; an
// error if the ranks cannot share it); or auto: shared memory when every rank can map the segment
// (all on this machine, whatever launched them), else Gloo on every rank.
enum class CpuBackend { kAuto, kGloo, kShm };
// "auto" | "gloo" | "shm", as in the config.
const char* cpu_backend_name(CpuBackend backend);
// The config value's backend; nullopt for any other string.
std::optional<CpuBackend> parse_cpu_backend(const std::string& name);

struct ProcessGroupOptions {
  int64_t rank = 0;
  int64_t world_size = 1;
  std::chrono::milliseconds timeout{300000};
  bool cuda = false;  // also register a backend for CUDA tensors (FABRIC_WITH_CUDA builds)
  // NCCL (default), or Gloo: several ranks may then share one GPU (tests, debugging).
  bool cuda_with_gloo = false;
  int64_t cuda_device = 0;  // this process's GPU
  // Every rank on this machine (self-launched job): Gloo talks over loopback. Otherwise Gloo binds
  // the interface named by GLOO_SOCKET_IFNAME, else the one this host's name resolves to.
  bool single_node = true;
  CpuBackend cpu_backend = CpuBackend::kAuto;
};

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, const ProcessGroupOptions& options);

// The backend that runs this group's CPU all-reduces: "fabric_shm" or "gloo".
std::string active_cpu_backend(c10d::ProcessGroup& group);

// Whether point-to-point sends of `device` tensors over `group` must go through host memory:
// a CUDA tensor whose group has no NCCL backend for CUDA (several ranks sharing one GPU: Gloo,
// or our shared-memory backend in front of it, whose send/recv read and write host pointers).
bool sends_through_host(c10d::ProcessGroup& group, const c10::Device& device);
// `t` as a send takes it: contiguous, and copied to host memory when `through_host`.
at::Tensor wire_tensor(const at::Tensor& t, bool through_host);

// Every rank's `tensor` (same shape and dtype everywhere), in rank order; failures name
// `collective` as wait() does.
std::vector<at::Tensor> all_gather(c10d::ProcessGroup& group, const at::Tensor& tensor,
                                   const std::string& collective);

// Waits for `work`. A failure (timeout, a peer gone) becomes fabric::Error naming `collective`
// and the usual cause, e.g. "all_reduce(sum) #3 (float32 [4]) did not complete: Timed out ...;
// every rank must call the same collectives in the same order (fabric.ddp.timeout_s bounds the
// wait)".
void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& collective);

}  // namespace fabric::distributed

#endif  // FABRIC_DISTRIBUTED_PROCESS_GROUP_H_
