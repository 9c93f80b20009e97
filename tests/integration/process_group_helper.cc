// Test helper for process_group_test: a self-launched job of WORLD processes that rendezvous via
// a TCPStore on an ephemeral port and check Gloo collectives. Exit 0 when every check passed.
//   process_group_helper WORLD
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <memory>

#include "fabric/distributed/process_group.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const int64_t world = std::atoll(argv[1]);
  auto env = fabric::detect_environment(fabric::process_environment(), world);
  const int64_t rank = env->global_rank();
  const std::chrono::seconds timeout(20);
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  if (rank == 0) {
    store = fabric::distributed::make_store({"127.0.0.1", 0, true, world, timeout});
    launcher = std::make_unique<fabric::SubprocessLauncher>(
        fabric::LaunchOptions{world, fabric::distributed::store_port(store)},
        std::vector<std::string>(argv, argv + argc));
  } else {
    store = fabric::distributed::make_store({"127.0.0.1", env->main_port(), false, world, timeout});
  }
  auto pg = fabric::distributed::make_process_group(store, {rank, world, timeout});
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "rank %lld: %s failed\n", static_cast<long long>(rank), what);
      ++failures;
    }
  };

  std::vector<torch::Tensor> sum = {torch::full({3}, static_cast<float>(rank + 1))};
  pg->allreduce(sum)->wait();
  check(torch::equal(sum[0], torch::full({3}, static_cast<float>(world * (world + 1) / 2))),
        "allreduce");

  std::vector<torch::Tensor> b = {rank == 0 ? torch::arange(4, torch::kFloat) : torch::zeros({4})};
  pg->broadcast(b)->wait();
  check(torch::equal(b[0], torch::arange(4, torch::kFloat)), "broadcast");

  std::vector<std::vector<torch::Tensor>> gathered(1);
  for (int64_t r = 0; r < world; ++r) gathered[0].push_back(torch::empty({2}));
  std::vector<torch::Tensor> mine = {torch::full({2}, static_cast<float>(rank))};
  pg->allgather(gathered, mine)->wait();
  for (int64_t r = 0; r < world; ++r)
    check(torch::equal(gathered[0][r], torch::full({2}, static_cast<float>(r))), "allgather");

  pg->barrier()->wait();
  std::printf("rank %lld of %lld: %s\n", static_cast<long long>(rank),
              static_cast<long long>(world), failures == 0 ? "ok" : "FAILED");
  std::fflush(stdout);
  if (failures) return 1;
  return launcher ? launcher->wait() : 0;
}
