#include "fabric/distributed/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "fabric/core/error.h"
#include "fabric/distributed/shm_backend.h"

namespace fabric::distributed {

namespace {

// A listening TCP socket bound to `address`:`port` (port 0: ephemeral); the TCPStore server takes
// it over (TCPStoreOptions::masterListenFd) and owns it from then on.
int listen_on(const std::string& address, int port) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (inet_pton(AF_INET, address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v4);
  } else if (inet_pton(AF_INET6, address.c_str(), &v6->sin6_addr) == 1) {
    family = AF_INET6;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(port));
    len = sizeof(*v6);
  } else {
    throw Error("cannot host the rendezvous store: listen address '" + address +
                "' is not a numeric IPv4 or IPv6 address");
  }
  const int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw Error(std::string("cannot host the rendezvous store: socket: ") + std::strerror(errno));
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, SOMAXCONN) != 0) {
    const std::string why = std::strerror(errno);
    close(fd);
    throw Error("cannot host the rendezvous store at " + address + ":" + std::to_string(port) +
                ": " + why +
                (port != 0 ? " (another job on this port? use MASTER_PORT=0 or another)" : ""));
  }
  return fd;
}

}  // namespace

c10::intrusive_ptr<c10d::Store> make_store(const StoreOptions& o) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(o.port);
  opts.isServer = o.is_server;
  opts.numWorkers = static_cast<std::size_t>(o.world_size);
  opts.waitWorkers = false;  // the process group's own rendezvous waits for every rank
  opts.timeout = o.timeout;
  if (o.is_server && !o.listen_address.empty())
    opts.masterListenFd = listen_on(o.listen_address, o.port);
  try {
    c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::TCPStore>(o.host, opts);
    if (!o.prefix.empty()) store = c10::make_intrusive<c10d::PrefixStore>(o.prefix, store);
    return store;
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw Error(std::string(o.is_server ? "cannot host" : "cannot reach") +
                " the rendezvous store at " + o.host + ":" + std::to_string(o.port) + ": " + why);
  }
}

int store_port(const c10::intrusive_ptr<c10d::Store>& store) {
  c10::intrusive_ptr<c10d::Store> s = store;
  while (auto* prefixed = dynamic_cast<c10d::PrefixStore*>(s.get()))
    s = prefixed->getUnderlyingStore();
  auto* tcp = dynamic_cast<c10d::TCPStore*>(s.get());
  if (tcp == nullptr) throw Error("store_port: not a TCPStore");
  return tcp->getPort();
}

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, const ProcessGroupOptions& o) {
  const int rank = static_cast<int>(o.rank);
  const int size = static_cast<int>(o.world_size);
  auto pg = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);

  auto gloo_options = c10d::ProcessGroupGloo::Options::create(o.timeout);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname != nullptr && *ifname) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (o.single_node) {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    gloo_options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
  c10::intrusive_ptr<c10d::Backend> cpu = gloo;
  // auto tries everywhere: ranks on other machines cannot open the segment, and then every rank
  // agrees on Gloo (make_shm_backend); ranks that do share a machine gain whatever the launcher.
  if (size > 1 && o.cpu_backend != CpuBackend::kGloo) {
    ShmBackendOptions shm_options;
    shm_options.rank = rank;
    shm_options.world_size = size;
    shm_options.timeout = o.timeout;
    std::string why_not;
    if (auto shm = make_shm_backend(store, gloo, shm_options, &why_not)) {
      cpu = shm;
    } else if (o.cpu_backend == CpuBackend::kShm) {
      throw Error("fabric.ddp.cpu_backend: shm: the ranks cannot share memory (" + why_not +
                  "); set it to auto or gloo");
    }
  }
  // Registered as Gloo, the type every CPU collective and the Reducer expect; the shared-memory
  // backend hands everything but all-reduce to the Gloo one.
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, cpu);
  pg->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);

  if (o.cuda && o.cuda_with_gloo) {
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::GLOO, gloo);
  } else if (o.cuda) {
#ifdef FABRIC_WITH_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(o.cuda_device));
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = o.timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
    pg->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    pg->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
#else
    throw Error("make_process_group: NCCL needs a CUDA build (not --config=cpu_only)");
#endif
  }
  return pg;
}

const char* cpu_backend_name(CpuBackend backend) {
  switch (backend) {
    case CpuBackend::kGloo:
      return "gloo";
    case CpuBackend::kShm:
      return "shm";
    case CpuBackend::kAuto:
      break;
  }
  return "auto";
}

std::optional<CpuBackend> parse_cpu_backend(const std::string& name) {
  for (CpuBackend b : {CpuBackend::kAuto, CpuBackend::kGloo, CpuBackend::kShm})
    if (name == cpu_backend_name(b)) return b;
  return std::nullopt;
}

std::string active_cpu_backend(c10d::ProcessGroup& group) {
  return group.getBackend(c10::DeviceType::CPU)->getBackendName();
}

at::Tensor wire_tensor(const at::Tensor& t, bool through_host) {
  return through_host ? t.contiguous().to(at::kCPU) : t.contiguous();
}

bool sends_through_host(c10d::ProcessGroup& group, const c10::Device& device) {
  if (!device.is_cuda() || !group.hasBackends()) return false;
  try {
    // Not a name test for "gloo": with cuda_with_gloo the CUDA entry is the CPU backend, which
    // may be fabric_shm (it hands send/recv to Gloo as they are, device pointers included).
    return group.getBackend(c10::DeviceType::CUDA)->getBackendName() != "nccl";
  } catch (const std::exception&) {
    return false;  // no CUDA backend registered: the default one's (NCCL when there is one)
  }
}

std::vector<at::Tensor> all_gather(c10d::ProcessGroup& group, const at::Tensor& tensor,
                                   const std::string& collective) {
  std::vector<at::Tensor> input = {tensor.contiguous()};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int64_t r = 0; r < group.getSize(); ++r) output[0].push_back(at::empty_like(input[0]));
  wait(group.allgather(output, input), collective);
  return output[0];
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, const std::string& collective) {
  try {
    work->wait();
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw Error(collective + " did not complete: " + why +
                "; every rank must call the same collectives in the same order "
                "(fabric.ddp.timeout_s bounds the wait)");
  }
}

}  // namespace fabric::distributed
