// Test helper for heartbeat_test: one rank of a job started by an "external launcher" (the test
// sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Prints "rank R ready" after the first
// all_reduce, then all-reduces forever; the test freezes or kills a rank and watches the others.
// Command line: the usual Fabric overrides (fabric/main.h).
#include <cstdio>

#include "fabric/fabric.h"
#include "fabric/main.h"

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, fabric::training_schema(), [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([](fabric::Fabric& f) {
      f.all_reduce(torch::ones({4}), fabric::ReduceOp::kSum);
      std::printf("rank %lld ready\n", static_cast<long long>(f.global_rank()));
      std::fflush(stdout);
      for (;;) f.all_reduce(torch::ones({4}), fabric::ReduceOp::kSum);
    });
  });
}
