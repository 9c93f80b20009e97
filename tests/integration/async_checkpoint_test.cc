// checkpoint.async (fabric/checkpointer.h) with real processes
// (tests/integration/resume_helper.cc):
//   - the files hold the state of the step they are named after, bitwise the synchronous ones,
//     although training goes on while they are written (one process and 2-rank DDP);
//   - a process killed while a background write is in flight leaves `latest` naming a complete
//     checkpoint, and resume: auto then finishes bitwise like the uninterrupted run;
//   - sharded folders (fsdp, 2 ranks) written in the background equal the synchronous ones;
//   - a background write that fails is an error on every rank, and no folder is left complete;
//   - a regular checkpoint is never written from non-finite weights, synchronous or not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <torch/types.h>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpointer.h"
#include "tests/checkpoint_diff.h"
#include "tests/integration/resume_helper_job.h"

namespace fs = std::filesystem;

namespace {

class AsyncCheckpointTest : public fabric::testing::ResumeHelperJob {
 protected:
  AsyncCheckpointTest()
      : ResumeHelperJob("optimizer.name=adamw checkpoint.every_n_steps=2 checkpoint.keep_last=0") {}

  std::string latest(const std::string& dir) {
    std::ifstream in(dir_ / dir / "latest");
    std::string name;
    std::getline(in, name);
    return name;
  }
};

TEST_F(AsyncCheckpointTest, FilesHoldTheirStepsStateBitwiseLikeSynchronousOnes) {
  for (const std::string devices : {"1", "2"}) {
    SCOPED_TRACE("fabric.devices=" + devices);
    const std::string job = "fabric.devices=" + devices + " test.extra_params=500000 ";
    auto sync = run(job + "checkpoint.dir=sync" + devices);
    ASSERT_EQ(sync.code, 0) << sync.out;
    auto async = run(job + "checkpoint.async=true checkpoint.dir=async" + devices);
    ASSERT_EQ(async.code, 0) << async.out;
    for (int step = 2; step <= 16; step += 2) {
      char name[32];
      std::snprintf(name, sizeof(name), "step-%08d.ckpt", step);
      EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / ("sync" + devices) / name,
                                                     dir_ / ("async" + devices) / name),
                "")
          << name;
    }
    EXPECT_EQ(latest("async" + devices), "step-00000016.ckpt");
    // The comparison can fail: neighbouring steps differ.
    EXPECT_NE(
        fabric::testing::compare_checkpoints(dir_ / ("sync" + devices) / "step-00000014.ckpt",
                                             dir_ / ("async" + devices) / "step-00000016.ckpt"),
        "");
  }
}

TEST_F(AsyncCheckpointTest, KilledDuringABackgroundWriteResumesBitwise) {
  // ~12 MB checkpoints; the process SIGKILLs itself after ~5.5 checkpoints' worth of written
  // bytes: inside the background write of the sixth (fault injection, fabric/core/atomic_file.h).
  const std::string job = "fabric.devices=1 test.extra_params=1000000 checkpoint.async=true ";
  auto full = run(job + "checkpoint.dir=full test.out=full.ckpt");
  ASSERT_EQ(full.code, 0) << full.out;
  const auto bytes = fs::file_size(dir_ / "full" / "step-00000002.ckpt");
  auto killed = run_with_env(job + "checkpoint.dir=killed",
                             "FABRIC_TEST_KILL_AFTER_BYTES=" + std::to_string(bytes * 11 / 2));
  ASSERT_EQ(killed.code, 128 + 9) << killed.out;
  bool partial = false;
  for (const auto& entry : fs::directory_iterator(dir_ / "killed")) {
    const std::string name = entry.path().filename().string();
    partial = partial || name.find(".tmp.") != std::string::npos;
    if (fabric::checkpoint_step(name) >= 0) {
      EXPECT_NO_THROW(fabric::load_archive(entry.path()));
    }
  }
  EXPECT_TRUE(partial) << "the kill did not land inside a write";
  const std::string newest = latest("killed");
  EXPECT_EQ(fabric::checkpoint_step(newest), 10) << newest;
  auto resumed = run(job + "checkpoint.dir=killed checkpoint.resume=killed test.out=resumed.ckpt");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("/killed/" + newest + " at step 10"), std::string::npos)
      << resumed.out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "full.ckpt", dir_ / "resumed.ckpt"), "");
}

TEST_F(AsyncCheckpointTest, ShardedFoldersWrittenInTheBackgroundEqualSynchronousOnes) {
  // fsdp over 2 ranks: every rank writes its shard in the background, rank 0 completes the folder.
  const std::string job = "fabric.devices=2 fabric.strategy=fsdp test.extra_params=500000 ";
  auto sync = run(job + "checkpoint.dir=sync");
  ASSERT_EQ(sync.code, 0) << sync.out;
  auto async = run(job + "checkpoint.async=true checkpoint.dir=async");
  ASSERT_EQ(async.code, 0) << async.out;
  for (int step = 2; step <= 16; step += 2) {
    char name[32];
    std::snprintf(name, sizeof(name), "step-%08d.ckpt", step);
    ASSERT_TRUE(fabric::is_sharded_checkpoint(dir_ / "async" / name)) << name;
    EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "sync" / name, dir_ / "async" / name), "")
        << name;
  }
  EXPECT_EQ(latest("async"), "step-00000016.ckpt");
  for (const auto& entry : fs::directory_iterator(dir_ / "async"))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
}

TEST_F(AsyncCheckpointTest, AFailedBackgroundWriteIsAnErrorOnEveryRankAndLeavesNoFolder) {
  // Every rank's writes fail (ENOSPC) after 1 MB: inside the first checkpoint's background write
  // (~3 MB per rank). The error comes at the next save, on every rank.
  auto r = run_with_env(
      "fabric.devices=2 fabric.strategy=fsdp test.extra_params=500000 checkpoint.async=true "
      "checkpoint.dir=ckpts",
      "FABRIC_TEST_FAIL_WRITE_AFTER_BYTES=1000000");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("checkpoint.async: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("No space left on device"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "ckpts" / "latest"));
  for (const auto& entry : fs::directory_iterator(dir_ / "ckpts")) {
    EXPECT_FALSE(fabric::is_sharded_checkpoint(entry.path())) << entry.path();
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

// Whether every floating-point tensor in `value` is finite.
bool all_finite(const c10::IValue& value) {
  if (value.isTensor()) {
    const auto& t = value.toTensor();
    return !t.is_floating_point() || t.numel() == 0 || torch::isfinite(t).all().item<bool>();
  }
  if (value.isGenericDict()) {
    for (const auto& item : value.toGenericDict())
      if (!all_finite(item.value())) return false;
  }
  if (value.isList()) {
    for (const auto& item : value.toList())
      if (!all_finite(item)) return false;
  }
  return true;
}

TEST_F(AsyncCheckpointTest, NonFiniteWeightsAreNeverCheckpointed) {
  for (const std::string async : {"false", "true"}) {
    SCOPED_TRACE("checkpoint.async=" + async);
    // lr 1e4 overflows the weights after a few steps; the guard is off, so training goes on.
    auto r =
        run("fabric.devices=1 optimizer.name=sgd optimizer.lr=1e4 trainer.stop_on_nonfinite=0 "
            "checkpoint.async=" +
            async + " checkpoint.dir=ckpt_" + async);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find(" not written: the weights are not finite (NaN or inf)"),
              std::string::npos)
        << r.out;
    int written = 0;
    for (const auto& entry : fs::directory_iterator(dir_ / ("ckpt_" + async))) {
      if (fabric::checkpoint_step(entry.path().filename().string()) < 0) continue;
      ++written;
      EXPECT_TRUE(all_finite(fabric::read_checkpoint(entry.path()).toGenericDict().at("state")))
          << entry.path();
    }
    EXPECT_GE(written, 1) << r.out;  // the first ones, before the overflow
    EXPECT_LT(written, 8) << r.out;  // 8 saves were due
  }
}

}  // namespace
