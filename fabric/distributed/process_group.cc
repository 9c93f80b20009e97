#include "fabric/distributed/process_group.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <cstdlib>

#include "fabric/core/error.h"

namespace fabric::distributed {

c10::intrusive_ptr<c10d::Store> make_store(const StoreOptions& o) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<std::uint16_t>(o.port);
  opts.isServer = o.is_server;
  opts.numWorkers = static_cast<std::size_t>(o.world_size);
  opts.waitWorkers = false;  // the process group's own rendezvous waits for every rank
  opts.timeout = o.timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(o.host, opts);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw Error(std::string(o.is_server ? "cannot host" : "cannot reach") +
                " the rendezvous store at " + o.host + ":" + std::to_string(o.port) + ": " + why);
  }
}

int store_port(const c10::intrusive_ptr<c10d::Store>& store) {
  auto* tcp = dynamic_cast<c10d::TCPStore*>(store.get());
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
  pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
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
