// A checkpoint folder belongs to one run (fabric/checkpointer.h): a second run into a folder that
// holds another run's checkpoints continues them when it resumes from one, and otherwise stops
// before training with one line naming the folder and the fix, leaving every file as it was; a
// run with its own folder writes beside them. Folders that cannot be written stop a run before
// training; a `latest` naming something else is refused, and so is a damaged checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/resume_helper_job.h"

namespace fs = std::filesystem;

namespace {

class CheckpointDirTest : public fabric::testing::ResumeHelperJob {
 protected:
  CheckpointDirTest() : ResumeHelperJob("checkpoint.every_n_steps=4 checkpoint.keep_last=0 ") {}

  // Each file of `folder` (checkpoints and `latest`) with its bytes.
  std::map<std::string, std::string> files(const std::string& folder) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / folder))
      if (e.is_regular_file()) {
        std::ifstream in(e.path(), std::ios::binary);
        out[e.path().lexically_relative(dir_).string()] =
            std::string(std::istreambuf_iterator<char>(in), {});
      }
    return out;
  }
};

TEST_F(CheckpointDirTest, ASecondRunContinuesTheFolderOrStopsWithoutTouchingIt) {
  for (const std::string devices : {"1", "2"}) {
    SCOPED_TRACE("fabric.devices=" + devices);
    const std::string job = "fabric.devices=" + devices + " ";
    const std::string shared = "shared" + devices;
    auto first = run(job + "trainer.max_steps=8 checkpoint.dir=" + shared);
    ASSERT_EQ(first.code, 0) << first.out;
    const auto before = files(shared);
    ASSERT_TRUE(before.count(shared + "/step-00000008.ckpt")) << first.out;

    // Without resuming: refused before training, every byte as it was.
    auto second = run(job + "checkpoint.dir=" + shared);
    EXPECT_EQ(second.code, 2) << second.out;
    EXPECT_NE(second.out.find("checkpoint.dir: " + (dir_ / shared).string() +
                              " holds the checkpoints of another run (newest "
                              "step-00000008.ckpt), which this run would overwrite; continue that "
                              "run with checkpoint.resume=auto (or its path), or give this run a "
                              "folder of its own (the default {run_dir}/checkpoints)"),
              std::string::npos)
        << second.out;
    EXPECT_TRUE(files(shared) == before);

    // A damaged copy given to resume from: refused on every rank with the key and what to give.
    {
      const fs::path cut = dir_ / ("cut" + devices + ".ckpt");
      fs::copy_file(dir_ / shared / "step-00000008.ckpt", cut);
      fs::resize_file(cut, fs::file_size(cut) / 2);
      auto damaged = run(job + "checkpoint.resume=" + cut.filename().string());
      EXPECT_EQ(damaged.code, 2) << damaged.out;
      EXPECT_NE(damaged.out.find("checkpoint.resume: " + cut.string() +
                                 ": not a readable PyTorch file ("),
                std::string::npos)
          << damaged.out;
      EXPECT_NE(damaged.out.find("); give an older checkpoint's path, or checkpoint.resume=auto"),
                std::string::npos)
          << damaged.out;
    }

    // Resuming from one of them (the folder, or its `latest` marker): the run continues the
    // folder.
    const std::string from = devices == "1" ? shared : shared + "/latest";
    auto resumed = run(job + "checkpoint.dir=" + shared + " checkpoint.resume=" + from);
    EXPECT_EQ(resumed.code, 0) << resumed.out;
    EXPECT_TRUE(fs::exists(dir_ / shared / "step-00000016.ckpt")) << resumed.out;

    // With a folder of its own (the default {run_dir}/checkpoints): beside them.
    auto own = run(job);
    EXPECT_EQ(own.code, 0) << own.out;
  }
}

// Where checkpoints or weights cannot go (or would destroy a checkpoint) is found before training
// (exit 2, the key named), and a `latest` that names anything but a checkpoint of its folder is
// refused naming `latest`.
TEST_F(CheckpointDirTest, FoldersThatCannotBeWrittenAndForeignLatestStopBeforeTraining) {
  std::ofstream(dir_ / "a_file") << "x";
  auto into_file = run("checkpoint.dir=a_file/ckpts");
  EXPECT_EQ(into_file.code, 2) << into_file.out;
  EXPECT_NE(into_file.out.find("checkpoint.dir: " + (dir_ / "a_file" / "ckpts").string() +
                               " cannot be a folder ("),
            std::string::npos)
      << into_file.out;
  EXPECT_EQ(into_file.out.find("done at step"), std::string::npos) << into_file.out;
  auto weights = run("checkpoint.export_weights=a_file/weights.pt");
  EXPECT_EQ(weights.code, 2) << weights.out;
  EXPECT_NE(weights.out.find("checkpoint.export_weights: " + (dir_ / "a_file").string() +
                             " cannot be a folder ("),
            std::string::npos)
      << weights.out;
  // Weights written over a checkpoint would destroy it: a .ckpt name, a folder, `latest` or a
  // sharded checkpoint's file is refused (fabric/checkpoint/output_check.h).
  fs::create_directories(dir_ / "old" / "step-00000003.ckpt");
  std::ofstream(dir_ / "old" / "latest") << "step-00000003.ckpt\n";
  for (const auto& [target, what] : std::vector<std::pair<std::string, std::string>>{
           {"old/step-00000004.ckpt", ": is a checkpoint's name (.ckpt)"},
           {"old/step-00000003.ckpt", ": is a folder; give a file name"},
           {"old/step-00000003.ckpt/common.pt", ": lies inside the checkpoint folder "},
           {"old/latest", ": is the marker naming the newest checkpoint of "},
           {"old", ": is a folder; give a file name"}}) {
    auto over = run("checkpoint.export_weights=" + target);
    EXPECT_EQ(over.code, 2) << over.out;
    EXPECT_NE(over.out.find("checkpoint.export_weights: " + (dir_ / target).string() + what),
              std::string::npos)
        << over.out;
  }
  // This run's own `latest` (not there yet) and its input weights are refused too.
  auto own = run("checkpoint.export_weights='\"{run_dir}/checkpoints/latest\"'");
  EXPECT_EQ(own.code, 2) << own.out;
  EXPECT_NE(own.out.find("checkpoints/latest: is the input "), std::string::npos) << own.out;
  // And the run's own files: its config (there at the start), its summary (written at the end).
  for (const std::string name : {"config.yaml", "summary.json"}) {
    auto mine = run("checkpoint.export_weights='\"{run_dir}/" + name + "\"'");
    EXPECT_EQ(mine.code, 2) << mine.out;
    EXPECT_NE(mine.out.find(name + ": is the input "), std::string::npos) << mine.out;
  }

  fs::create_directories(dir_ / "foreign");
  std::ofstream(dir_ / "foreign" / "latest") << "/etc/passwd\n";
  auto foreign = run("checkpoint.resume=foreign");
  EXPECT_EQ(foreign.code, 2) << foreign.out;
  EXPECT_NE(foreign.out.find("checkpoint.resume: " + (dir_ / "foreign" / "latest").string() +
                             " names '/etc/passwd', which is no checkpoint of "),
            std::string::npos)
      << foreign.out;
}

}  // namespace
