// Exact resume and crash safety, with real processes (tests/integration/resume_helper.cc):
//   N steps  ≡  k steps + checkpoint + a new process that resumes + N − k steps,
// compared bitwise over the whole saved state (parameters, BatchNorm buffers, AdamW state,
// scheduler, data loader position, every rank's random generators), with k in the middle of an
// epoch, for one process and for a 2-rank DDP job (Gloo on CPU); and SIGKILL at random moments of
// a run that saves at every step, followed by checkpoint.resume=auto, 20 times.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpointer.h"
#include "tests/checkpoint_diff.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

class ResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "resume_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The helper with the common settings plus `args`, from dir_.
  fabric::testing::CommandResult run(const std::string& args, const std::string& prefix = "") {
    const std::string exe = fabric::testing::helper_binary("//tests/integration:resume_helper");
    return fabric::testing::run_command(
        "cd '" + dir_.string() + "' && " + prefix + " '" + exe +
        "' fabric.accelerator=cpu optimizer.name=adamw optimizer.lr=0.01 scheduler.name=cosine "
        "trainer.max_steps=16 data.batch_size=4 data.num_workers=2 checkpoint.export_weights=none "
        "logging.run_dir=runs/{name}/{timestamp} " +
        args);
  }

  // N steps in one go vs k steps, stop, resume from the step-k checkpoint in a new process.
  void expect_exact_resume(const std::string& job, int64_t k) {
    auto full = run(job + " checkpoint.every_n_epochs=0 test.out=full.ckpt");
    ASSERT_EQ(full.code, 0) << full.out;
    auto first =
        run(job + " checkpoint.every_n_epochs=0 checkpoint.every_n_steps=" + std::to_string(k) +
            " test.stop_at_step=" + std::to_string(k) + " checkpoint.dir=first");
    ASSERT_EQ(first.code, 0) << first.out;
    char name[32];
    std::snprintf(name, sizeof(name), "step-%08lld.ckpt", static_cast<long long>(k));
    ASSERT_TRUE(fs::exists(dir_ / "first" / name)) << first.out;
    auto second = run(job + " checkpoint.every_n_epochs=0 checkpoint.resume=first/" +
                      std::string(name) + " checkpoint.dir=second test.out=resumed.ckpt");
    ASSERT_EQ(second.code, 0) << second.out;
    EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
    EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / "resumed.ckpt"), "");
    // The comparison can fail: one step less differs.
    auto short_run = run(job + " trainer.max_steps=15 test.out=short.ckpt");
    ASSERT_EQ(short_run.code, 0) << short_run.out;
    EXPECT_NE(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / "short.ckpt"), "");
  }

  fs::path dir_;
};

TEST_F(ResumeTest, OneProcessMidEpochResumeIsBitwiseExact) {
  // 40 examples, batch 4: 10 batches per epoch; step 13 is in the middle of epoch 1.
  expect_exact_resume("fabric.devices=1", 13);
}

TEST_F(ResumeTest, TwoRankDdpMidEpochResumeIsBitwiseExact) {
  // 2 ranks: 5 batches per epoch and rank; step 7 is in the middle of epoch 1.
  expect_exact_resume("fabric.strategy=ddp fabric.devices=2 fabric.ddp.timeout_s=60", 7);
}

TEST_F(ResumeTest, KilledAtRandomMomentsResumesFromACompleteCheckpoint) {
  // ~24 MB checkpoints (2M extra parameters + AdamW state) at every one of 16 steps. Trials 0-2:
  // SIGKILL from outside at a random time of the run; trials 3-5: the process SIGKILLs itself
  // after a random number of written bytes (fault injection, fabric/core/atomic_file.h), i.e. in
  // the middle of writing a random checkpoint. Then checkpoint.resume=auto must finish the run
  // with the uninterrupted run's state, bitwise.
  const std::string job =
      "fabric.devices=1 test.extra_params=2000000 checkpoint.every_n_steps=1 "
      "checkpoint.every_n_epochs=0 checkpoint.keep_last=2 ";
  const auto start = std::chrono::steady_clock::now();
  auto full = run(job + "test.out=full.ckpt checkpoint.dir=full");
  ASSERT_EQ(full.code, 0) << full.out;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto checkpoint_bytes = static_cast<int64_t>(fs::file_size(dir_ / "full.ckpt"));
  std::mt19937 gen(2026);
  std::uniform_real_distribution<double> when(0.05, seconds);
  std::uniform_int_distribution<int64_t> byte(0, 16 * checkpoint_bytes);
  int killed = 0, killed_while_writing = 0, resumed_from_checkpoint = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const std::string runs = "runs" + std::to_string(trial);
    const std::string common = job + "logging.run_dir=" + runs + "/{name}/{timestamp} ";
    std::string how;
    int64_t kill_after = -1;
    if (trial < 3) {
      char after[32];
      std::snprintf(after, sizeof(after), "%.3f", when(gen));
      how = std::string("timeout -s KILL ") + after;
    } else {
      kill_after = byte(gen);
      how = "FABRIC_TEST_KILL_AFTER_BYTES=" + std::to_string(kill_after);
    }
    auto crashed = run(common, how);
    const bool was_killed = crashed.code == 128 + 9 || crashed.code == 137;
    killed += was_killed;
    // A crash may leave a temporary file behind, never a truncated checkpoint.
    std::error_code none_yet;  // killed before the run directory existed
    bool partial = false;
    for (const auto& entry : fs::recursive_directory_iterator(dir_ / runs, none_yet)) {
      const std::string name = entry.path().filename().string();
      partial = partial || name.find(".ckpt.tmp.") != std::string::npos;
      if (fabric::checkpoint_step(name) >= 0) {
        EXPECT_NO_THROW(fabric::load_archive(entry.path())) << entry.path();
      }
    }
    killed_while_writing += partial;
    if (kill_after >= 0) {
      // Fault injection is deterministic: the process dies inside a checkpoint write, always.
      EXPECT_TRUE(was_killed) << how << "\n" << crashed.out;
      EXPECT_TRUE(partial) << how << "\n" << crashed.out;
    }
    auto resumed = run(common + "checkpoint.resume=auto test.out=" + runs + ".ckpt");
    ASSERT_EQ(resumed.code, 0) << "trial " << trial << ": " << how << "\n" << resumed.out;
    EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / (runs + ".ckpt")), "")
        << "trial " << trial << ": " << how << "\n"
        << resumed.out;
    const bool from_checkpoint = resumed.out.find("resumed from") != std::string::npos;
    resumed_from_checkpoint += from_checkpoint;
    if (kill_after >= 2 * checkpoint_bytes) {
      // At least one complete checkpoint was written before the kill: auto must find it.
      EXPECT_TRUE(from_checkpoint) << how << "\n" << resumed.out;
    }
    fs::remove_all(dir_ / runs);
    fs::remove(dir_ / (runs + ".ckpt"));
  }
  std::cout << "killed " << killed << " of 6 runs, " << killed_while_writing
            << " while writing a checkpoint; " << resumed_from_checkpoint
            << " resumed from a checkpoint (others were killed before the first)" << std::endl;
  // The timed kills (trials 0-2) may land after a fast run has finished; only the fault-injected
  // trials are asserted to die, so the test does not depend on the machine's speed.
}

TEST_F(ResumeTest, AutoSkipsADamagedNewestCheckpointAndOneThatIsNone) {
  const std::string job =
      "fabric.devices=1 checkpoint.every_n_steps=4 checkpoint.every_n_epochs=0 ";
  auto first = run(job + "test.stop_at_step=8");
  ASSERT_EQ(first.code, 0) << first.out;
  // A truncated copy of step 8 as the newest file: auto must not choose it.
  fs::path newest;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "runs"))
    if (e.path().filename() == "step-00000008.ckpt") newest = e.path();
  ASSERT_FALSE(newest.empty()) << first.out;
  const auto damaged = newest.parent_path() / "step-00000009.ckpt";
  fs::copy_file(newest, damaged);
  fs::resize_file(damaged, fs::file_size(damaged) / 2);
  // Newer still: a whole, readable file that is no checkpoint (weights under a checkpoint's name).
  const auto weights = newest.parent_path() / "step-00000010.ckpt";
  c10::impl::GenericDict w = fabric::new_dict();
  w.insert("weight", torch::ones({2}));
  fabric::save_archive(weights, w);
  auto second = run(job + "checkpoint.resume=auto");
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("warning: checkpoint.resume=auto: skipping " + weights.string() +
                            ": not a Fabric++ checkpoint"),
            std::string::npos)
      << second.out;
  EXPECT_NE(second.out.find("warning: checkpoint.resume=auto: skipping " + damaged.string()),
            std::string::npos)
      << second.out;
  EXPECT_NE(second.out.find("resumed from " + newest.string() + " at step 8"), std::string::npos)
      << second.out;
  // Every checkpoint there damaged: auto stops (exit 2) instead of starting over beside them.
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "runs"))
    if (e.path().extension() == ".ckpt" && e.is_regular_file())
      fs::resize_file(e.path(), fs::file_size(e.path()) / 2);
  auto third = run(job + "checkpoint.resume=auto");
  EXPECT_EQ(third.code, 2) << third.out;
  EXPECT_NE(third.out.find("checkpoint.resume: auto: no checkpoint of the earlier"),
            std::string::npos)
      << third.out;
  EXPECT_EQ(third.out.find("starting from scratch"), std::string::npos) << third.out;
}

TEST_F(ResumeTest, AutoFindsTheRunDirectoryItsHashNamed) {
  // {hash} leaves checkpoint.* out: the same command plus checkpoint.resume=auto finds the folder
  // (it started from scratch while the hash covered checkpoint.resume).
  const std::string job =
      "fabric.devices=1 trainer.max_steps=8 checkpoint.every_n_steps=4 "
      "checkpoint.every_n_epochs=0 logging.run_dir=hashed/{name}-{hash} ";
  auto first = run(job);
  ASSERT_EQ(first.code, 0) << first.out;
  auto second = run(job + "checkpoint.resume=auto");
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("at step 8"), std::string::npos) << second.out;
  // Another config is another folder: nothing of this one to resume.
  auto other = run(job + "optimizer.lr=0.02 checkpoint.resume=auto");
  ASSERT_EQ(other.code, 0) << other.out;
  EXPECT_NE(other.out.find("starting from scratch"), std::string::npos) << other.out;
}

TEST_F(ResumeTest, RewindingRotatesTheAbandonedCheckpointsFirst) {
  const std::string job =
      "fabric.devices=1 checkpoint.every_n_epochs=0 checkpoint.keep_last=3 checkpoint.dir=fixed ";
  auto first = run(job + "checkpoint.every_n_steps=2 test.stop_at_step=8");
  ASSERT_EQ(first.code, 0) << first.out;
  // Back to step 4 (of 4, 6, 8), one checkpoint a step up to 7: the folder keeps this run's 5, 6
  // and 7, not the abandoned step 8 (rotation by step number kept 8 and dropped 5).
  auto second = run(job +
                    "checkpoint.every_n_steps=1 test.stop_at_step=7 "
                    "checkpoint.resume=fixed/step-00000004.ckpt");
  ASSERT_EQ(second.code, 0) << second.out;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "fixed"))
    if (e.path().extension() == ".ckpt") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"step-00000005.ckpt", "step-00000006.ckpt",
                                             "step-00000007.ckpt"}))
      << second.out;
}

TEST_F(ResumeTest, AFailedWriteLeavesTheEarlierCheckpointsIntact) {
  const std::string job =
      "fabric.devices=1 checkpoint.every_n_steps=4 checkpoint.every_n_epochs=0 ";
  // What a run writes up to its first checkpoint (config.yaml, step 4, the latest marker).
  auto probe = run(job + "test.stop_at_step=4 logging.run_dir=probe");
  ASSERT_EQ(probe.code, 0) << probe.out;
  int64_t first_bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "probe"))
    if (e.is_regular_file()) first_bytes += static_cast<int64_t>(e.file_size());
  const auto ckpt_bytes =
      static_cast<int64_t>(fs::file_size(dir_ / "probe" / "checkpoints" / "step-00000004.ckpt"));
  // The disk "fills up" in the middle of the step-8 checkpoint.
  auto r =
      run(job + "test.stop_at_step=12 logging.run_dir=failing",
          "FABRIC_TEST_FAIL_WRITE_AFTER_BYTES=" + std::to_string(first_bytes + ckpt_bytes / 2));
  EXPECT_EQ(r.code, 1) << r.out;
  const fs::path ckpts = dir_ / "failing" / "checkpoints";
  const std::string expected = "error: cannot write " + (ckpts / "step-00000008.ckpt").string() +
                               ": write failed: No space left on device";
  EXPECT_NE(r.out.find(expected + " (while saving a checkpoint, after 8 optimizer steps of this "
                                  "process)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NO_THROW(fabric::load_archive(ckpts / "step-00000004.ckpt"));
  EXPECT_FALSE(fs::exists(ckpts / "step-00000008.ckpt"));
  std::ifstream latest(ckpts / "latest");
  std::string marker;
  std::getline(latest, marker);
  EXPECT_EQ(marker, "step-00000004.ckpt");
  for (const auto& e : fs::directory_iterator(ckpts))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
