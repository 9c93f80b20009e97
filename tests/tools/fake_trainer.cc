// A Fabric program that trains nothing, for //tests/tools:sweep_test: it has the real command line
// and config checks (fabric::run_main, fabric::training_schema) and writes summary.json to its run
// directory with fake_metric = 1 - 10 (optimizer.lr - 0.2)^2 + 0.001 fabric.seed.
//
// Test controls (environment): FAKE_INVOCATIONS=FILE appends "lr seed" per run; FAKE_CPUS_LOG=FILE
// appends the FABRIC_CPUS it was given ("unset" when none); FAKE_ROOT_LOG=FILE appends data.root
// made absolute as Fabric programs do (fabric/core/paths.h); FAKE_FAIL_LR=X
// fails (exit 1, one error line, its run directory created) when optimizer.lr == X;
// FAKE_DIVERGE_LR=X stops as a diverged Fabric program does (summary.json with "stopped", exit 3)
// when optimizer.lr == X; FAKE_BLOCK_LR=X writes its pid to the file $FAKE_STARTED then blocks
// until killed when optimizer.lr == X; FAKE_FAIL_EARLY_ROOT=X fails (exit 1) before creating its
// run directory when data.root == X; FAKE_CRASH_LR=X writes summary.json, then dies silently of
// SIGKILL; FAKE_NAN_LR=X writes fake_metric NaN (null in summary.json); FAKE_NO_METRIC_LR=X writes
// a summary.json without fake_metric.
//
// Training (for pruners): FAKE_STEPS=N "trains" N steps of FAKE_STEP_MS milliseconds each (default
// 20), logging fake/score = fake_metric · step / N to metrics.csv at every step. SIGTERM stops it
// as a Fabric example stops: it saves its step to <logging.run_dir>.fake_ckpt and exits 143; with
// checkpoint.resume=auto it starts from that step. FAKE_STEPS_LOG=FILE appends "lr from to" for
// every attempt (the steps it trained). FAKE_LINGER_MS=N: after writing summary.json it takes N ms
// more to exit, with SIGTERM's default action back (a program killed while exiting).
// FAKE_STOP_SUMMARY=1: a SIGTERM stop also writes summary.json as Fabric does ("exit_status":
// 143, "stopped": null).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/logging/metrics_csv.h"
#include "fabric/logging/run_dir.h"
#include "fabric/main.h"

namespace {

bool env_is(const char* name, double value) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::stod(v) == value;
}

std::atomic<bool> stop_requested{false};

// FAKE_STEPS: trains step by step (see the top); returns the exit status.
int train_steps(const fabric::Config& c, const fabric::RunDirectory& run, double metric,
                int steps) {
  const char* step_ms = std::getenv("FAKE_STEP_MS");
  const auto pause = std::chrono::milliseconds(step_ms ? std::atoi(step_ms) : 20);
  const std::string checkpoint = c.get_string("logging.run_dir") + ".fake_ckpt";
  int from = 0;
  if (c.get_string("checkpoint.resume") == "auto") std::ifstream(checkpoint) >> from;
  struct sigaction action {};
  action.sa_handler = [](int) { stop_requested = true; };
  sigaction(SIGTERM, &action, nullptr);
  fabric::CsvMetrics metrics(run.path() / "metrics.csv");
  int step = from;
  while (step < steps && !stop_requested) {
    std::this_thread::sleep_for(pause);
    ++step;
    metrics.log({{"fake/score", metric * step / steps}, {"epoch", 1}}, step);
    metrics.flush();
  }
  if (const char* log = std::getenv("FAKE_STEPS_LOG"))
    std::ofstream(log, std::ios::app)
        << c.get_double("optimizer.lr") << " " << from << " " << step << "\n";
  if (step < steps) {
    std::ofstream(checkpoint) << step << "\n";
    if (std::getenv("FAKE_STOP_SUMMARY") != nullptr)
      run.write_summary({{"fake_metric", metric * step / steps},
                         {"steps", step},
                         {"name", "fake"},
                         {"exit_status", 128 + SIGTERM},
                         {"stopped", nullptr}});
    return 128 + SIGTERM;
  }
  run.write_summary({{"fake_metric", metric}, {"steps", step}, {"name", "fake"}});
  if (const char* linger = std::getenv("FAKE_LINGER_MS")) {  // exiting slowly, SIGTERM fatal again
    signal(SIGTERM, SIG_DFL);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(linger)));
  }
  return 0;
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
    if (const char* log = std::getenv("FAKE_ROOT_LOG"))
      std::ofstream(log, std::ios::app)
          << fabric::absolute_from_working_directory(c.get_string("data.root")).string() << "\n";
    if (env_is("FAKE_BLOCK_LR", lr)) {
      std::ofstream(std::getenv("FAKE_STARTED")) << getpid() << "\n";
      while (true) pause();
    }
    if (const char* root = std::getenv("FAKE_FAIL_EARLY_ROOT");
        root != nullptr && c.get_string("data.root") == root)
      throw fabric::Error("fake early failure at data.root " + std::string(root));
    const auto run = fabric::RunDirectory::create(c, "fake", true);
    if (env_is("FAKE_FAIL_LR", lr)) throw fabric::Error("fake failure at lr " + std::to_string(lr));
    if (env_is("FAKE_CRASH_LR", lr)) {
      run.write_summary({{"fake_metric", 0.5}, {"steps", 10}, {"name", "fake"}});
      raise(SIGKILL);
    }
    if (env_is("FAKE_NAN_LR", lr)) {
      run.write_summary({{"fake_metric", std::nan("")}, {"steps", 10}, {"name", "fake"}});
      return 0;
    }
    if (env_is("FAKE_NO_METRIC_LR", lr)) {
      run.write_summary({{"fake_metrik", 0.5}, {"steps", 10}, {"name", "fake"}});
      return 0;
    }
    if (env_is("FAKE_DIVERGE_LR", lr)) {
      run.write_summary({{"steps", 7},
                         {"name", "fake"},
                         {"stopped",
                          "the loss was not finite for 3 consecutive steps on rank 0 "
                          "(detected at step 7; trainer.stop_on_nonfinite: 3)"}});
      return 3;
    }
    const double metric = 1 - 10 * (lr - 0.2) * (lr - 0.2) + 0.001 * seed;
    if (const char* steps = std::getenv("FAKE_STEPS"))
      return train_steps(c, run, metric, std::atoi(steps));
    run.write_summary({{"fake_metric", metric}, {"steps", 10}, {"name", "fake"}});
    return 0;
  });
}
