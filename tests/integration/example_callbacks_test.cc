// Every example honours every callback and profiler key it documents (configs/README.md,
// docs/training.md "Callbacks", "Profiler", "Reduce on plateau"): one run each of gpt, cifar10,
// fashion_mnist and image_classifier (tiny data, a few steps, one process) with
// profiler.enabled, callbacks.model_summary, callbacks.lr_monitor, callbacks.early_stopping and
// scheduler.name: plateau, each checked for its effect: a trace file and the ops table, the
// model's table, an lr/group_0 column, the run stopped early, the rate reduced after the
// evaluations reported to it. What an example cannot honour is refused before any process
// starts (exit 2, one line naming the key and the fix; fabric.max_restarts restarts none), and a
// GPT run whose weights diverged without stopping still writes summary.json.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/gpt_example_fixture.h"

namespace fabric::testing {
namespace {

// metrics.csv's column `name` by step (cells that are empty left out).
std::map<int64_t, double> column(const fs::path& csv, const std::string& name) {
  std::ifstream in(csv);
  std::map<int64_t, double> out;
  auto split = [](const std::string& row) {
    std::vector<std::string> cells;
    std::stringstream text(row);
    for (std::string cell; std::getline(text, cell, ',');) cells.push_back(cell);
    return cells;
  };
  std::string line;
  if (!std::getline(in, line)) return out;
  const auto header = split(line);
  const size_t at = std::find(header.begin(), header.end(), name) - header.begin();
  while (std::getline(in, line)) {
    const auto cells = split(line);
    if (at < cells.size() && !cells[at].empty()) out[std::stoll(cells[0])] = std::stod(cells[at]);
  }
  return out;
}

// The keys under test, for an example evaluating at `every_key` = 1: the profiler records one
// step (the second), early stopping cannot see min_delta 10 met so it stops at the third
// evaluation (patience 2), and plateau (patience 0, threshold 0.9, gamma 0.5) halves the rate at
// every evaluation after the first.
std::string every_key(const std::string& every_key) {
  return " " + every_key +
         "=1 profiler.enabled=true profiler.wait=0 profiler.warmup=1 profiler.active=1"
         " callbacks.model_summary=true callbacks.lr_monitor=true"
         " callbacks.early_stopping.patience=2 callbacks.early_stopping.min_delta=10"
         " scheduler.name=plateau scheduler.patience=0 scheduler.threshold=0.9"
         " scheduler.gamma=0.5 scheduler.warmup_steps=0 logging.run_dir=run";
}

class ExampleCallbacksTest : public GptExampleTest {
 protected:
  // `r` (run directory dir_/run) stopped early at its third evaluation, at step `stopped_at`,
  // after evaluations at `evaluated` (their steps); each key had its effect.
  void expect_every_key_acted(const Result& r, const std::string& monitor,
                              const std::vector<int64_t>& evaluated) {
    ASSERT_EQ(r.code, 0) << r.out;
    const auto s = summary_of(r);
    EXPECT_EQ(s["steps"], evaluated.back()) << r.out;
    EXPECT_NE(s["stopped_early"].get<std::string>().find(
                  "early stopping at step " + std::to_string(evaluated.back()) + ": " + monitor),
              std::string::npos)
        << r.out;
    // profiler.enabled: one trace, the table printed at the end.
    const fs::path traces = dir_ / "run" / "profiler";
    EXPECT_TRUE(fs::exists(traces / "rank_0_step_2.pt.trace.json")) << r.out;
    EXPECT_NE(r.out.find("profiler: 1 trace(s) per rank in " + traces.string()), std::string::npos)
        << r.out;
    // callbacks.model_summary: the table's last line.
    EXPECT_NE(r.out.find(" trainable), "), std::string::npos) << r.out;
    // callbacks.lr_monitor and scheduler.name: plateau: the rate of the first group, logged at
    // every logging window, halved by each report after the first; each report logged.
    const fs::path csv = dir_ / "run" / "metrics.csv";
    const auto group = column(csv, "lr/group_0"), lr = column(csv, "lr");
    const auto reported = column(csv, "scheduler/monitored");
    ASSERT_TRUE(group.count(1) && group.count(evaluated.back())) << bytes(csv);
    for (size_t i = 0; i < evaluated.size(); ++i) {
      const int64_t at = evaluated[i];
      EXPECT_TRUE(reported.count(at)) << "no report at step " << at << "\n" << bytes(csv);
      // Logged before that step's evaluation: reduced by the reports before it (all but the first).
      const double factor = i < 2 ? 1.0 : (i == 2 ? 0.5 : 0.25);
      EXPECT_NEAR(group.at(at) / group.at(1), factor, 1e-9) << "step " << at << "\n" << bytes(csv);
      EXPECT_NEAR(lr.at(at) / lr.at(1), factor, 1e-9) << "step " << at;
    }
  }

  // An IDX file of unsigned bytes (what Fashion-MNIST's .gz files hold, read plain too).
  static void write_idx(const fs::path& file, const std::vector<int32_t>& shape, int seed) {
    std::ofstream out(file, std::ios::binary);
    out.write("\0\0\x08", 3);
    out.put(static_cast<char>(shape.size()));
    int64_t count = 1;
    for (int32_t d : shape) {
      for (int shift = 24; shift >= 0; shift -= 8) out.put(static_cast<char>((d >> shift) & 255));
      count *= d;
    }
    for (int64_t i = 0; i < count; ++i)
      out.put(static_cast<char>(shape.size() == 1 ? (i * 7 + seed) % 10 : (i * 31 + seed) % 251));
  }

  // A NumPy .npy of `shape` in dtype `descr` ("|u1" or "<i8"), element i = f(i).
  static void write_npy(const fs::path& file, const std::string& descr,
                        const std::vector<int64_t>& shape) {
    std::string dims;
    int64_t count = 1;
    for (int64_t d : shape) {
      dims += std::to_string(d) + ",";
      count *= d;
    }
    std::string header =
        "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
    header += std::string(63 - (10 + header.size()) % 64, ' ') + "\n";
    std::ofstream out(file, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    out.put(static_cast<char>(header.size() & 255)).put(static_cast<char>(header.size() >> 8));
    out << header;
    for (int64_t i = 0; i < count; ++i) {
      if (descr == "|u1") {
        out.put(static_cast<char>((i * 31) % 251));
      } else {
        const int64_t label = i % 4;
        out.write(reinterpret_cast<const char*>(&label), sizeof(label));
      }
    }
  }
};

// gpt at gpt.eval_every_n_steps=1: evaluations at steps 1, 2, 3 (stopped there, of 6); the
// plateau schedule watches val/loss (the GPT example's default scheduler.monitor), then
// train/loss (the mean since the last evaluation: here that step's, as logged).
TEST_F(ExampleCallbacksTest, GptHonoursEveryCallbackAndProfilerKey) {
  for (const std::string monitor : {"val/loss", "train/loss"}) {
    SCOPED_TRACE(monitor);
    fs::remove_all(dir_ / "run");
    const Result r =
        run("gpt", args(1) +
                       " logging.log_every_n_steps=1"
                       " callbacks.early_stopping.monitor=val/loss" +
                       every_key("gpt.eval_every_n_steps") + " scheduler.monitor=" + monitor);
    expect_every_key_acted(r, "val/loss", {1, 2, 3});
    const auto watched = column(dir_ / "run" / "metrics.csv", monitor);
    const auto reported = column(dir_ / "run" / "metrics.csv", "scheduler/monitored");
    for (int64_t step : {1, 2, 3})
      EXPECT_NEAR(reported.at(step), watched.at(step), 1e-6 * watched.at(step)) << step;
  }
}

// The image examples share one loop: each with trainer.eval_every_n_epochs=1 and 2 steps an
// epoch evaluates at steps 2, 4, 6 (stopped there, at epoch 3 of 6), plateau on train/loss.
TEST_F(ExampleCallbacksTest, ImageExamplesHonourEveryCallbackAndProfilerKey) {
  const fs::path fmnist = dir_ / "fmnist";
  fs::create_directories(fmnist);
  for (const char* split : {"train", "t10k"}) {
    const int n = split[0] == 't' && split[1] == 'r' ? 64 : 32;
    write_idx(fmnist / (std::string(split) + "-images-idx3-ubyte.gz"), {n, 28, 28}, 1);
    write_idx(fmnist / (std::string(split) + "-labels-idx1-ubyte.gz"), {n}, 3);
  }
  const fs::path npy = dir_ / "npy";
  for (const char* split : {"train", "val"}) {
    const int64_t n = split[0] == 't' ? 64 : 32;
    fs::create_directories(npy / split);
    write_npy(npy / split / "inputs.npy", "|u1", {n, 8, 8});
    write_npy(npy / split / "targets.npy", "<i8", {n});
  }
  const std::string common =
      " fabric.accelerator=cpu fabric.devices=1 data.batch_size=32 trainer.max_epochs=6"
      " trainer.max_steps=-1 logging.log_every_n_steps=1 checkpoint.export_weights=none"
      " callbacks.early_stopping.monitor=test/accuracy scheduler.monitor=train/loss" +
      every_key("trainer.eval_every_n_epochs");
  const std::vector<std::pair<std::string, std::string>> examples = {
      {"cifar10",
       "--config=single_cpu.yaml model.width=4 data.synthetic=true"
       " data.synthetic_train_size=64 data.synthetic_test_size=32"},
      {"fashion_mnist", "model.width=4 model.hidden=8 data.root=" + fmnist.string()},
      {"image_classifier", "model.width=4 data.root=" + npy.string()},
  };
  for (const auto& [example, args] : examples) {
    SCOPED_TRACE(example);
    fs::remove_all(dir_ / "run");
    expect_every_key_acted(run(example, args + common), "test/accuracy", {2, 4, 6});
  }
}

// Refused before any process starts, one line naming the key and the fix, exit 2 (a config
// error: fabric.max_restarts, given here, restarts none of them).
TEST_F(ExampleCallbacksTest, KeysAnExampleCannotHonourAreRefusedBeforeTraining) {
  struct Case {
    std::string example, args, expected;
  };
  const std::string gpt = args(1) + " fabric.max_restarts=2";
  const std::string cifar =
      std::string("--config=single_cpu.yaml") + kTinyCifar + " fabric.max_restarts=2";
  const std::vector<Case> cases = {
      {"gpt", gpt + " callbacks.early_stopping.monitor=val/loss",
       "command line: callbacks.early_stopping.monitor: early stopping cannot act while "
       "gpt.eval_every_n_steps is 0 (one evaluation, at the end): set gpt.eval_every_n_steps=N "
       "to evaluate every N"},
      {"gpt", gpt + " scheduler.name=plateau",
       "command line: scheduler.name: plateau cannot act while gpt.eval_every_n_steps is 0"},
      {"gpt", gpt + " gpt.eval_every_n_steps=1 callbacks.early_stopping.monitor=val/acc",
       "command line: callbacks.early_stopping.monitor: 'val/acc' is not a metric this program "
       "evaluates (it has val/loss)"},
      {"gpt",
       gpt + " gpt.eval_every_n_steps=1 scheduler.name=plateau "
             "scheduler.monitor=test/accuracy",
       "command line: scheduler.monitor: 'test/accuracy' is not reported by this program "
       "(scheduler.name: plateau; it reports val/loss, train/loss)"},
      {"gpt", gpt + " model.n_embd=30 model.n_head=4",
       "command line: model.n_embd: 30 is not a multiple of model.n_head 4"},
      {"cifar10", cifar + " trainer.eval_every_n_epochs=0 callbacks.early_stopping.monitor=epoch",
       "callbacks.early_stopping.monitor: early stopping cannot act while "
       "trainer.eval_every_n_epochs is 0"},
      {"cifar10", cifar + " scheduler.name=plateau scheduler.monitor=val/loss",
       "scheduler.monitor: 'val/loss' is not reported by this program (scheduler.name: plateau; "
       "it reports test/accuracy, train/loss)"},
  };
  for (const Case& c : cases) {
    const Result r = run(c.example, c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    // gpt: before launching, the only line; cifar10: each rank's line, then the restart agent's
    // "not restarting".
    const std::string line = c.example == "gpt" ? r.out : r.out.substr(0, r.out.find('\n') + 1);
    EXPECT_NE(line.find(c.expected), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_EQ(std::count(line.begin(), line.end(), '\n'), 1) << r.out;
    EXPECT_EQ(r.out.find("restart 1 of"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir_ / "runs")) << "a run started: " << r.out;
  }
}

// Weights that diverge in the last steps (fewer non-finite losses than trainer.stop_on_nonfinite
// counts) gave no summary before: the sample after training failed on LibTorch's "probability
// tensor contains inf/nan" (exit 1). Now the run ends with a line saying why there is no sample,
// and summary.json.
TEST_F(ExampleCallbacksTest, GptDivergedWithoutStoppingStillWritesItsSummary) {
  const Result r = run("gpt", args(1) +
                                  " optimizer.name=sgd optimizer.lr=1e30"
                                  " trainer.stop_on_nonfinite=0 gpt.sample_tokens=5");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t line = r.out.find("gpt: no sample: the validation loss is ");
  ASSERT_NE(line, std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" (the weights diverged: lower optimizer.lr", line), std::string::npos)
      << r.out;
  EXPECT_EQ(summary_of(r)["sample"], "(no sample: the validation loss is not finite)");
}

}  // namespace
}  // namespace fabric::testing
