// State dict files: round trip, strict matching, and one-line errors for bad files.
#include "fabric/checkpoint/state_dict.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "fabric/core/error.h"

namespace fs = std::filesystem;

namespace {

// Conv → BatchNorm (parameters and buffers) → Linear.
torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Conv2d(1, 4, 3), torch::nn::BatchNorm2d(4),
                               torch::nn::Flatten(), torch::nn::Linear(4 * 6 * 6, 3));
}

class StateDictTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fs::path(::testing::TempDir()); }
  fs::path dir_;

};

TEST_F(StateDictTest, RoundTripAndStrictLoad) {
  torch::manual_seed(0);
  auto model = make_model();
  model->forward(torch::randn({2, 1, 8, 8}));  // moves BatchNorm running stats off their init
  const fs::path file = dir_ / "weights.pt";
  fabric::save_state_dict(file, fabric::state_dict(*model));
  auto fresh = make_model();
  fabric::load_state_dict(*fresh, fabric::load_state_dict_file(file), file.string());
  const auto a = fabric::state_dict(*model), b = fabric::state_dict(*fresh);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;

  auto other = torch::nn::Sequential(torch::nn::Conv2d(1, 5, 3), torch::nn::BatchNorm2d(4));
  const auto before = fabric::state_dict(*other);
  try {
    fabric::load_state_dict(*other, fabric::load_state_dict_file(file), file.string());
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              file.string() +
                  ": does not match the model: unexpected [3.bias, 3.weight]; shape of 0.weight "
                  "is [4, 1, 3, 3] in the file, [5, 1, 3, 3] in the model; shape of 0.bias is [4] "
                  "in the file, [5] in the model");
  }
  // Nothing was copied on failure.
  const auto after = fabric::state_dict(*other);
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(before[i].second, after[i].second));
}

TEST_F(StateDictTest, BadFilesFailWithOneLineNamingThem) {
  auto message = [](const fs::path& p) {
    try {
      fabric::load_state_dict_file(p);
    } catch (const fabric::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message(dir_ / "absent.pt"),
            (dir_ / "absent.pt").string() + ": cannot open (No such file or directory)");
  std::ofstream(dir_ / "random.pt") << "\x13\x37 not a checkpoint at all";
  EXPECT_EQ(message(dir_ / "random.pt").rfind((dir_ / "random.pt").string() +
                                                  ": not a readable PyTorch state dict file (",
                                              0),
            0u)
      << message(dir_ / "random.pt");
  // A truncated file (the first half of a good one).
  fabric::save_state_dict(dir_ / "good.pt", fabric::state_dict(*make_model()));
  std::ifstream in(dir_ / "good.pt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir_ / "truncated.pt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_EQ(message(dir_ / "truncated.pt").rfind((dir_ / "truncated.pt").string() + ": not a readable", 0), 0u)
      << message(dir_ / "truncated.pt");
  EXPECT_EQ(message(dir_ / "truncated.pt").find('\n'), std::string::npos);
  // Writing where a folder cannot exist: the error names the file; nothing is left behind.
  std::ofstream(dir_ / "plainfile") << "x";
  try {
    fabric::save_state_dict(dir_ / "plainfile" / "w.pt", {});
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("cannot write " + (dir_ / "plainfile" / "w.pt").string() + ": ", 0), 0u)
        << e.what();
  }
}

}  // namespace
