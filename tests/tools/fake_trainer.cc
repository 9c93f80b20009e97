// A Fabric program that trains nothing, for //tests/tools:sweep_test: it has the real command line
// and config checks (fabric::run_main, fabric::training_schema) and writes summary.json to its run
// directory with fake_metric = 1 - 10 (optimizer.lr - 0.2)^2 + 0.001 fabric.seed.
//
// Test controls (environment): FAKE_INVOCATIONS=FILE appends "lr seed" per run; FAKE_CPUS_LOG=FILE
// appends the FABRIC_CPUS it was given ("unset" when none); FAKE_FAIL_LR=X
// fails (exit 1, one error line) when optimizer.lr == X; FAKE_DIVERGE_LR=X stops as a diverged
// Fabric program does (summary.json with "stopped", exit 3) when optimizer.lr == X;
// FAKE_BLOCK_LR=X writes its pid to the file $FAKE_STARTED then blocks until killed when
// optimizer.lr == X.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/logging/run_dir.h"
#include "fabric/main.h"

namespace {

bool env_is(const char* name, double value) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::stod(v) == value;
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, fabric::training_schema(), [](const fabric::Config& c) {
    const double lr = c.get_double("optimizer.lr");
    const int64_t seed = c.get_int("fabric.seed");
    if (const char* log = std::getenv("FAKE_INVOCATIONS")) {
      std::ofstream(log, std::ios::app) << lr << " " << seed << "\n";
    }
    if (const char* log = std::getenv("FAKE_CPUS_LOG")) {
      const char* cpus = std::getenv("FABRIC_CPUS");
      std::ofstream(log, std::ios::app) << (cpus ? cpus : "unset") << "\n";
    }
    if (env_is("FAKE_FAIL_LR", lr)) throw fabric::Error("fake failure at lr " + std::to_string(lr));
    if (env_is("FAKE_BLOCK_LR", lr)) {
      std::ofstream(std::getenv("FAKE_STARTED")) << getpid() << "\n";
      while (true) pause();
    }
    const auto run = fabric::RunDirectory::create(c, "fake", true);
    if (env_is("FAKE_DIVERGE_LR", lr)) {
      run.write_summary({{"steps", 7},
                         {"name", "fake"},
                         {"stopped",
                          "the loss was not finite for 3 consecutive steps on rank 0 "
                          "(detected at step 7; trainer.stop_on_nonfinite: 3)"}});
      return 3;
    }
    run.write_summary({{"fake_metric", 1 - 10 * (lr - 0.2) * (lr - 0.2) + 0.001 * seed},
                       {"steps", 10},
                       {"name", "fake"}});
    return 0;
  });
}
