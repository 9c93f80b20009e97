// A minimal user loop (tests/integration/user_loop_helper.cc: its own model and loop, no key of the
// training schema read by it) with the keys only a loop can implement:
//   - every key the config set that nothing read is named at the end, with its origin (a warning;
//     fabric.strict_keys: true makes it exit 2), and a run setting none names none;
//   - Fabric applies model.init_weights in setup and trainer.gradient_clip_val in step;
//   - an evaluation on a few batches between checkpoints does not break exact resume: a run
//     SIGKILLed after a checkpoint and resumed logs the uninterrupted run's values, with
//     Fabric::evaluate(limit) and with the loop's own break + DataLoader::end_pass(); without
//     end_pass the resumed values differ (what the test would catch).
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

class UserLoopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "user_loop_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  fabric::testing::CommandResult run(const std::string& args) {
    const std::string exe = fabric::testing::helper_binary("//tests/integration:user_loop_helper");
    return fabric::testing::run_command("cd '" + dir_.string() + "' && '" + exe +
                                        "' fabric.accelerator=cpu fabric.devices=1 " + args);
  }

  // The lines of `out` that start with `prefix`, from the one naming step `after` + 1 on.
  static std::vector<std::string> lines(const std::string& out, const std::string& prefix,
                                        int64_t after = 0) {
    std::vector<std::string> found;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(prefix, 0) != 0) continue;
      const int64_t step = std::stoll(line.substr(prefix.size()));
      if (step > after) found.push_back(line);
    }
    return found;
  }

  // The largest of field `field` (1: gradient norm, 2: largest magnitude) over the step lines.
  static double largest_grad(const std::string& out, int field) {
    double most = 0;
    for (const auto& line : lines(out, "step ")) {
      std::istringstream words(line);
      std::string step, n, grad;
      double norm = 0, magnitude = 0;
      words >> step >> n >> grad >> norm >> magnitude;
      most = std::max(most, field == 1 ? norm : magnitude);
    }
    return most;
  }

  fs::path dir_;
};

constexpr const char* kNeverRead = "never read by this program";

TEST_F(UserLoopTest, KeysNothingReadAreNamedWithTheirOrigin) {
  std::ofstream(dir_ / "user.yaml") << "trainer:\n  ema_decay: 0.9\n";
  auto r =
      run("--config=user.yaml logging.progress_bar=false trainer.accumulate_grad_batches=4 "
          "data.num_workers=2 "
          "trainer.stop_on_nonfinite=3 data.batch_size=16 test.steps=3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("warning: 6 keys the config sets were never read by this program"),
            std::string::npos)
      << r.out;
  for (const char* named :
       {"trainer.ema_decay: 0.9 (user.yaml:2:14)",
        "trainer.accumulate_grad_batches: 4 (command line)", "data.num_workers: 2 (command line)",
        "trainer.stop_on_nonfinite: 3 (command line)", "data.batch_size: 16 (command line)",
        "logging.progress_bar: false (command line)"})
    EXPECT_NE(r.out.find(named), std::string::npos) << named << "\n" << r.out;
  // Keys Fabric reads are not named; logging.progress_bar is, as this loop draws no progress bar.
  EXPECT_EQ(r.out.find("fabric.devices:"), std::string::npos) << r.out;

  auto strict = run("--config=user.yaml fabric.strict_keys=true test.steps=3");
  EXPECT_EQ(strict.code, 2) << strict.out;
  EXPECT_NE(strict.out.find("error: fabric.strict_keys: 1 key the config sets was never read by "
                            "this program, so it had no effect: trainer.ema_decay: 0.9"),
            std::string::npos)
      << strict.out;

  // A key set to its default changes nothing and is not named; nor is anything in a run that
  // sets only what is read.
  auto clean = run("test.steps=3 trainer.ema_decay=0 checkpoint.every_n_steps=2");
  ASSERT_EQ(clean.code, 0) << clean.out;
  EXPECT_EQ(clean.out.find(kNeverRead), std::string::npos) << clean.out;
}

TEST_F(UserLoopTest, GradientClippingKeyTakesEffectInStep) {
  auto plain = run("test.steps=6");
  ASSERT_EQ(plain.code, 0) << plain.out;
  ASSERT_GT(largest_grad(plain.out, 1), 0.05) << plain.out;  // clipping would change something
  ASSERT_GT(largest_grad(plain.out, 2), 0.01) << plain.out;

  auto by_norm = run("test.steps=6 trainer.gradient_clip_val=0.05");
  ASSERT_EQ(by_norm.code, 0) << by_norm.out;
  EXPECT_LE(largest_grad(by_norm.out, 1), 0.05 * (1 + 1e-6)) << by_norm.out;
  EXPECT_EQ(by_norm.out.find(kNeverRead), std::string::npos) << by_norm.out;

  auto by_value =
      run("test.steps=6 trainer.gradient_clip_val=0.01 "
          "trainer.gradient_clip_algorithm=value");
  ASSERT_EQ(by_value.code, 0) << by_value.out;
  EXPECT_LE(largest_grad(by_value.out, 2), 0.01) << by_value.out;
  EXPECT_EQ(by_value.out.find(kNeverRead), std::string::npos) << by_value.out;
}

TEST_F(UserLoopTest, InitWeightsKeyTakesEffectInSetup) {
  auto saved = run("test.steps=1 fabric.seed=7 test.save_init=init.pt");
  ASSERT_EQ(saved.code, 0) << saved.out;
  const std::string init = fabric::testing::value_after(saved.out, "init ");
  auto other_seed = run("test.steps=1 fabric.seed=1");
  ASSERT_EQ(other_seed.code, 0) << other_seed.out;
  ASSERT_NE(fabric::testing::value_after(other_seed.out, "init "), init);  // the load matters

  auto loaded = run("test.steps=1 fabric.seed=1 model.init_weights=init.pt");
  ASSERT_EQ(loaded.code, 0) << loaded.out;
  EXPECT_EQ(fabric::testing::value_after(loaded.out, "init "), init) << loaded.out;
  EXPECT_EQ(loaded.out.find(kNeverRead), std::string::npos) << loaded.out;

  auto missing = run("test.steps=1 model.init_weights=/nonexistent.pt");
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("command line: model.init_weights: "), std::string::npos)
      << missing.out;
  EXPECT_NE(missing.out.find("/nonexistent.pt"), std::string::npos) << missing.out;
}

TEST_F(UserLoopTest, EvaluationWithALimitDoesNotBreakExactResume) {
  const std::string common =
      "test.steps=12 checkpoint.every_n_steps=1 checkpoint.every_n_epochs=0 ";
  for (const std::string eval :
       {"", "test.own_eval=true ", "test.own_eval=true test.end_pass=false "}) {
    SCOPED_TRACE(eval.empty() ? "Fabric::evaluate" : eval);
    const std::string job = common + eval;
    auto full = run(job + "logging.run_dir=full/{name}");
    ASSERT_EQ(full.code, 0) << full.out;
    auto killed = run(job + "logging.run_dir=cut/{name}/{timestamp} test.kill_at_step=5");
    ASSERT_EQ(killed.code, 128 + 9) << killed.out;
    auto resumed = run(job + "logging.run_dir=cut/{name}/{timestamp} checkpoint.resume=auto");
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    ASSERT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
    const auto live = lines(full.out, "val step ", 5), again = lines(resumed.out, "val step ", 5);
    ASSERT_EQ(live.size(), 3u) << full.out;  // steps 6, 9, 12
    if (eval.find("end_pass=false") == std::string::npos) {
      EXPECT_EQ(again, live) << resumed.out;
      EXPECT_EQ(lines(resumed.out, "step ", 5), lines(full.out, "step ", 5));
    } else {
      // A pass left early without end_pass is "in progress" in the checkpoint: the resumed run
      // continues it where the live one starts the next epoch.
      EXPECT_NE(again, live) << resumed.out;
    }
  }
}

TEST_F(UserLoopTest, AnErrorInTheLoopSaysWhereItHappened) {
  auto forward = run("test.fail=forward");
  EXPECT_EQ(forward.code, 1) << forward.out;
  EXPECT_NE(forward.out.find("(in forward (the loop's code before backward), after 2 optimizer "
                             "steps of this process)"),
            std::string::npos)
      << forward.out;
  EXPECT_NE(forward.out.find("error: view size is not compatible"), std::string::npos)
      << forward.out;
  EXPECT_EQ(forward.out.find("frame #"), std::string::npos) << forward.out;

  auto backward = run("test.fail=backward");
  EXPECT_EQ(backward.code, 1) << backward.out;
  EXPECT_NE(backward.out.find("(in backward, after 2 optimizer steps of this process)"),
            std::string::npos)
      << backward.out;

  // Weights loaded in the loop: said as loading, not as the forward the phase was in before.
  auto loading = run("test.fail=load");
  EXPECT_EQ(loading.code, 1) << loading.out;
  EXPECT_NE(loading.out.find("no_such_weights.safetensors"), std::string::npos) << loading.out;
  EXPECT_NE(loading.out.find("(while loading a checkpoint or weights, after 2 optimizer steps of "
                             "this process)"),
            std::string::npos)
      << loading.out;

  // A parameter the loss stops using under ddp: LibTorch's words advise Python's
  // DistributedDataParallel(find_unused_parameters=True); the hint names our key.
  auto unused = run("fabric.devices=2 fabric.strategy=ddp test.fail=unused");
  EXPECT_EQ(unused.code, 1) << unused.out;
  EXPECT_NE(unused.out.find("under ddp every parameter that requires a gradient must get one in "
                            "every backward: set fabric.ddp.find_unused_parameters: true"),
            std::string::npos)
      << unused.out;

  const std::string exe = fabric::testing::helper_binary("//tests/integration:user_loop_helper");
  auto debug = fabric::testing::run_command("cd '" + dir_.string() + "' && FABRIC_DEBUG=1 '" + exe +
                                            "' fabric.accelerator=cpu test.fail=forward");
  EXPECT_EQ(debug.code, 1) << debug.out;
  EXPECT_NE(debug.out.find("FABRIC_DEBUG: LibTorch's whole message, with the C++ stack"),
            std::string::npos)
      << debug.out;
  EXPECT_NE(debug.out.find("frame #"), std::string::npos) << debug.out;
}

}  // namespace
