// CPU collective time, shared memory (fabric/distributed/shm_backend.h) vs Gloo over loopback, for
// ranks on this machine (self-launched): all_reduce (default), reduce_scatter or all_gather
// (--collective; sizes are then the elements of the full tensor, rounded up to a multiple of
// --world, each rank holding 1/world of it).
//   bazel run -c opt //tools/bench:allreduce -- --world=2 --sizes=1024,262144,4718592 --reps=30
// Sizes are float32 element counts (4,718,592 ≈ ddp_step's 4.72M-parameter gradient bucket). Rank
// 0 prints one line per size: median microseconds of both and their ratio, and the shared-memory
// algorithm's bandwidth (bytes reduced per second). --chunk_bytes sets the shared-memory chunk.
#include <ATen/Parallel.h>
#include <gflags/gflags.h>
#include <torch/types.h>
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
DEFINE_string(collective, "all_reduce", "all_reduce | reduce_scatter | all_gather");

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
  const std::string kind = FLAGS_collective;
  if (kind != "all_reduce" && kind != "reduce_scatter" && kind != "all_gather") {
    if (rank == 0)
      std::fprintf(stderr, "--collective: '%s' is not all_reduce, reduce_scatter or all_gather\n",
                   kind.c_str());
    return 2;
  }
  if (rank == 0) std::printf("collective %s\n", kind.c_str());
  while (std::getline(list, item, ',')) {
    int64_t n = std::atoll(item.c_str());
    double shm_us = 0, gloo_us = 0;
    if (kind == "all_reduce") {
      std::vector<torch::Tensor> t = {torch::randn({n})};
      shm_us = median_us([&] { shm->allreduce(t)->wait(); }, FLAGS_reps);
      gloo_us = median_us([&] { gloo->allreduce(t)->wait(); }, FLAGS_reps);
    } else {
      n = (n + world - 1) / world * world;
      torch::Tensor full = torch::randn({n}), part = torch::randn({n / world});
      if (kind == "reduce_scatter") {
        shm_us = median_us([&] { shm->_reduce_scatter_base(part, full)->wait(); }, FLAGS_reps);
        try {
          gloo_us = median_us([&] { gloo->_reduce_scatter_base(part, full)->wait(); }, FLAGS_reps);
        } catch (const std::exception& e) {  // say so, and go on with shared memory's figure
          if (rank == 0)
            std::printf("gloo reduce_scatter: %s\n", std::string(e.what()).substr(0, 120).c_str());
          gloo_us = 0;
        }
      } else {
        shm_us = median_us([&] { shm->_allgather_base(full, part)->wait(); }, FLAGS_reps);
        gloo_us = median_us([&] { gloo->_allgather_base(full, part)->wait(); }, FLAGS_reps);
      }
    }
    if (rank == 0)
      std::printf("%12lld %12.1f %12.1f %8.3f %10.2f\n", static_cast<long long>(n), shm_us, gloo_us,
                  shm_us / gloo_us, 4.0 * static_cast<double>(n) / shm_us / 1000.0);
  }
  std::fflush(stdout);
  return launcher ? launcher->wait() : 0;
}
