// bazel run //tools/bench:checkpoint_stall -- [checkpoint.async=true] [key=value ...]
//
// How long a checkpoint stops training: the cifar10 example's ResNet-18 (CIFAR variant, 11.2M
// parameters) with its optimizer (SGD with momentum by default) trains on random 32×32 batches;
// every bench.steps_between steps the Checkpointer saves (checkpoint.dir under the run directory,
// rotation as configured). Printed: each save's stall (the time Checkpointer::save() holds the
// loop), the training steps' median time, the wall time of the loop, and one line
//   checkpoint_stall async=1 saves=5 median_stall_ms=... median_step_ms=... loop_s=... bytes=...
// Every other key of the training schema works (fabric.devices=2 for DDP, optimizer.name, ...).
// Extra keys: bench.saves (5), bench.steps_between (10), bench.batch (64).
// Not a test: timings are never asserted. Numbers and commands: docs/reliability.md.
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "examples/common/models.h"
#include "fabric/checkpointer.h"
#include "fabric/fabric.h"
#include "fabric/main.h"
#include "fabric/training/optimizers.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("bench.saves", fabric::KeySpec::integer(5).min(1));
  schema.add("bench.steps_between", fabric::KeySpec::integer(10).min(1));
  schema.add("bench.batch", fabric::KeySpec::integer(64).min(1));
  schema.set_default("checkpoint.every_n_epochs", "0");
  schema.set_default("checkpoint.save_last", "false");
  schema.set_default("checkpoint.export_weights", "none");
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) {
      examples::ResNet18Cifar model;
      auto optimizer = fabric::make_optimizer(c, model->parameters());
      f.setup(model, *optimizer);
      const int64_t batch = c.get_int("bench.batch");
      const auto x = torch::randn({batch, 3, 32, 32}).to(f.device());
      const auto y = torch::randint(0, 10, {batch}).to(f.device());
      fabric::CheckpointState state;
      state.add("model", model).add("optimizer", *optimizer);
      const auto run = f.create_run_directory("checkpoint_stall");
      fabric::Checkpointer checkpoints(f, state, "checkpoint_stall", run.path());
      std::vector<double> stalls, steps, first_steps;  // first_steps: the first after a save
      const auto loop_start = Clock::now();
      std::filesystem::path last;
      for (int64_t s = 0; s < c.get_int("bench.saves"); ++s) {
        for (int64_t k = 0; k < c.get_int("bench.steps_between"); ++k) {
          const auto step_start = Clock::now();
          optimizer->zero_grad();
          torch::Tensor loss;
          {
            auto guard = f.autocast();
            loss = torch::cross_entropy_loss(model->forward(x), y);
          }
          f.backward(loss);
          f.step(*optimizer);
          loss.item<float>();  // the step is done (CUDA: synchronized) before it is timed
          checkpoints.step_end();
          (s > 0 && k == 0 ? first_steps : steps).push_back(ms_since(step_start));
        }
        const auto save_start = Clock::now();
        last = checkpoints.save();
        stalls.push_back(ms_since(save_start));
        f.print("save ", s + 1, ": stall ", stalls.back(), " ms");
      }
      checkpoints.finish();  // waits for an asynchronous write
      const double loop_s = ms_since(loop_start) / 1000;
      std::error_code ec;
      const auto bytes = std::filesystem::file_size(last, ec);
      char line[256];
      std::snprintf(line, sizeof(line),
                    "checkpoint_stall async=%d saves=%zu median_stall_ms=%.2f median_step_ms=%.2f "
                    "median_first_step_after_save_ms=%.2f loop_s=%.3f bytes=%lld",
                    c.get_bool("checkpoint.async") ? 1 : 0, stalls.size(), median(stalls),
                    median(steps), median(first_steps), loop_s,
                    ec ? -1LL : static_cast<long long>(bytes));
      f.print(line);
      return 0;
    });
  });
}
