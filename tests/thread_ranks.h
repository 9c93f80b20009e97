// Ranks as threads of one test process: `world` threads, each with its own Gloo process group over
// one HashStore, run fn(rank, group); returns each rank's exception text ("" when it threw none).
// The groups outlive every thread: a rank that throws at once must not close its connections while
// another is still inside Gloo's connectFullMesh ("Connection closed by peer": llama_test in CI,
// 2026-12-02). Including this turns PyTorch's collective flight recorder off
// (flight_recorder_off.h).
#ifndef TESTS_THREAD_RANKS_H_
#define TESTS_THREAD_RANKS_H_

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "fabric/distributed/process_group.h"
#include "tests/flight_recorder_off.h"

namespace fabric::testing {

using RankMain = std::function<void(int64_t, const c10::intrusive_ptr<c10d::ProcessGroup>&)>;

inline std::vector<std::string> on_thread_ranks(int64_t world, const RankMain& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(world);
  std::vector<c10::intrusive_ptr<c10d::ProcessGroup>> groups(world);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < world; ++rank)
    threads.emplace_back([&, rank] {
      try {
        fabric::distributed::ProcessGroupOptions options;
        options.rank = rank;
        options.world_size = world;
        options.cpu_backend = fabric::distributed::CpuBackend::kGloo;
        groups[rank] = fabric::distributed::make_process_group(store, options);
        fn(rank, groups[rank]);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace fabric::testing

#endif  // TESTS_THREAD_RANKS_H_
