// fabric/checkpoint/output_check.h: no output is written over a checkpoint (a .ckpt name, a
// sharded folder's files, `latest`) or an input.
#include "fabric/checkpoint/output_check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"

namespace fs = std::filesystem;

namespace fabric {
namespace {

class OutputCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "checkpoints");
  }
  void touch(const fs::path& p) {
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "x";
  }
  std::string error_of(const fs::path& out, const std::vector<InputPath>& inputs = {},
                       bool folder = false, const std::vector<std::string>& written = {}) {
    try {
      check_output(out, "OUT", inputs, folder, written);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(OutputCheckTest, CheckpointsAreNeverWrittenOver) {
  const fs::path ckpts = dir_ / "checkpoints";
  touch(ckpts / "step-00000003.ckpt");
  EXPECT_EQ(error_of(ckpts / "step-00000003.ckpt"),
            (ckpts / "step-00000003.ckpt").string() +
                ": is a checkpoint's name (.ckpt); the output would be written over it or be "
                "taken for one; choose another OUT");
  // A sharded checkpoint: its files, and anything else inside it, whatever its name.
  const fs::path sharded = ckpts / "step-00000006";
  touch(sharded / kShardedCommon);
  touch(sharded / kShardedManifest);
  for (const char* name : {"common.pt", "latest", "weights.safetensors"})
    EXPECT_EQ(error_of(sharded / name),
              (sharded / name).string() + ": lies inside the checkpoint folder " +
                  sharded.string() + ", which writing would damage; choose another OUT outside it")
        << name;
  EXPECT_EQ(error_of(sharded), sharded.string() + ": is a folder; give a file name as OUT");
  EXPECT_NE(error_of(sharded, {}, /*folder=*/true).find("is a sharded checkpoint folder"),
            std::string::npos);
  // The marker naming the newest checkpoint.
  touch(ckpts / "latest");
  EXPECT_EQ(error_of(ckpts / "latest"),
            (ckpts / "latest").string() + ": is the marker naming the newest checkpoint of " +
                ckpts.string() + ", which writing would replace; choose another OUT");
  // Beside them, a new weights file is fine; so is a file called latest elsewhere.
  EXPECT_EQ(error_of(ckpts / "weights.pt"), "");
  EXPECT_EQ(error_of(dir_ / "latest"), "");
}

// A weights output replaces an earlier weights file, never another kind of file, a FIFO or a
// device.
TEST_F(OutputCheckTest, AWeightsOutputReplacesOnlyWeights) {
  const auto weights_error = [&](const fs::path& out) {
    try {
      check_weights_output(out, "OUT", {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::ofstream(dir_ / "config.yaml") << "fabric:\n  seed: 1\n";
  EXPECT_EQ(weights_error(dir_ / "config.yaml"),
            (dir_ / "config.yaml").string() +
                ": is an existing file that is not a weights file (neither .safetensors nor a "
                "torch.save zip), which writing would replace; choose another OUT or remove the "
                "file first");
  std::ofstream(dir_ / "old.pt") << std::string("PK\3\4rest of a zip", 17);
  EXPECT_EQ(weights_error(dir_ / "old.pt"), "");
  EXPECT_EQ(weights_error(dir_ / "new.pt"), "");
  EXPECT_EQ(weights_error("/dev/null"),
            "/dev/null: is a character device, not a file; choose another OUT");
}

TEST_F(OutputCheckTest, AFolderOutputChecksEveryFileItWrites) {
  touch(dir_ / "data" / "input.txt");
  const std::vector<InputPath> inputs = {{dir_ / "data" / "train.bin", "--input"}};
  touch(dir_ / "data" / "train.bin");
  // nanoGPT's layout (input.txt beside train.bin) is fine while no written file is an input.
  EXPECT_EQ(error_of(dir_ / "data", {{dir_ / "data" / "input.txt", "--input"}}, true,
                     {"train.bin", "val.bin"}),
            "");
  EXPECT_NE(error_of(dir_ / "data", inputs, true, {"train.bin", "val.bin"})
                .find("train.bin: is the input "),
            std::string::npos);
  touch(dir_ / "file");
  EXPECT_EQ(error_of(dir_ / "file", {}, true),
            (dir_ / "file").string() + ": is a regular file, not a folder; give a folder as OUT");
}

}  // namespace
}  // namespace fabric
