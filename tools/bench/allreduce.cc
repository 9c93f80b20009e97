// CPU all-reduce time, shared memory (fabric/distributed/shm_backend.h) vs Gloo over loopback, for
// ranks on this machine (self-launched).
//   bazel run -c opt //tools/bench:allreduce -- --world=2 --sizes=1024,262144,4718592 --reps=30
// Sizes are float32 element counts (4,718,592 ≈ ddp_step's 4.72M-parameter gradient bucket). Rank
// 0 prints one line per size: median microseconds of both and their ratio, and the shared-memory
// algorithm's bandwidth (bytes reduced per second). --chunk_bytes sets the shared-memory chunk.
#include <gflags/gflags.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "fabric/distributed/process_group.h"
#include "fabric/distributed/shm_backend.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"

DEFINE_int32(world, 2, "processes");
DEFINE_string(sizes, "1024,65536,1048576,4718592", "float32 element counts");
DEFINE_int32(reps, 30, "timed all-reduces per size and backend");
DEFINE_int64(chunk_bytes, 256 << 10, "shared-memory chunk per rank");
DEFINE_int32(threads, 1, "intra-op threads per rank");

namespace {

double median_us(const std::function<void()>& once, int reps) {
  for (int i = 0; i < 3; ++i) once();
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  at::set_num_threads(FLAGS_threads);
  const int64_t world = FLAGS_world;
  auto env = fabric::detect_environment(fabric::process_environment(), world);
  const int64_t rank = env->global_rank();
  namespace distributed = fabric::distributed;
  const std::chrono::seconds timeout(60);
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  if (rank == 0) {
    store = distributed::make_store({"127.0.0.1", 0, true, world, timeout});
    launcher = std::make_unique<fabric::SubprocessLauncher>(
        fabric::LaunchOptions{world, distributed::store_port(store)}, args);
  } else {
    store = distributed::make_store({"127.0.0.1", env->main_port(), false, world, timeout});
  }
  distributed::ProcessGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.cpu_backend = distributed::CpuBackend::kGloo;
  auto gloo = distributed::make_process_group(store, options);
  distributed::ShmBackendOptions shm_options;
  shm_options.rank = rank;
  shm_options.world_size = world;
  shm_options.chunk_bytes = FLAGS_chunk_bytes;
  auto shm = distributed::make_shm_backend(c10::make_intrusive<c10d::PrefixStore>("shm", store), {},
                                           shm_options);
  if (!shm) return 1;
  std::stringstream list(FLAGS_sizes);
  std::string item;
  if (rank == 0)
    std::printf("world %lld, chunk %lld bytes\n%12s %12s %12s %8s %10s\n",
                static_cast<long long>(world), static_cast<long long>(FLAGS_chunk_bytes),
                "elements", "shm_us", "gloo_us", "ratio", "shm_GB/s");
  while (std::getline(list, item, ',')) {
    const int64_t n = std::atoll(item.c_str());
    std::vector<torch::Tensor> t = {torch::randn({n})};
    const double shm_us = median_us([&] { shm->allreduce(t)->wait(); }, FLAGS_reps);
    const double gloo_us = median_us([&] { gloo->allreduce(t)->wait(); }, FLAGS_reps);
    if (rank == 0)
      std::printf("%12lld %12.1f %12.1f %8.3f %10.2f\n", static_cast<long long>(n), shm_us, gloo_us,
                  shm_us / gloo_us, 4.0 * static_cast<double>(n) / shm_us / 1000.0);
  }
  std::fflush(stdout);
  return launcher ? launcher->wait() : 0;
}
