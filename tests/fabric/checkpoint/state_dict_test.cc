// State dict files: round trip, Python's torch.load(weights_only=True) reading ours (the
// interpreter tools/setup.sh installs torch into), strict matching, one-line errors for bad files.
#include "fabric/checkpoint/state_dict.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "fabric/core/error.h"
#include "tests/run_command.h"

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

  // Runs `program` with the setup's Python and `file` as its argument.
  fabric::testing::CommandResult run_python(const std::string& program, const fs::path& file) {
    return fabric::testing::run_python(program, dir_, file.string());
  }
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
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;

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
  for (size_t i = 0; i < after.size(); ++i)
    EXPECT_TRUE(torch::equal(before[i].second, after[i].second));
}

// Another model's file: the lists are cut with a count, so the error stays one readable line.
TEST_F(StateDictTest, AnotherModelsFileIsOneShortLine) {
  torch::nn::Sequential wide, deep;
  for (int i = 0; i < 40; ++i) wide->push_back(torch::nn::Linear(4, 4));
  for (int i = 0; i < 12; ++i) deep->push_back(torch::nn::Linear(3, 3));
  const fs::path file = dir_ / "wide.pt";
  fabric::save_state_dict(file, fabric::state_dict(*wide));
  try {
    fabric::load_state_dict(*deep, fabric::load_state_dict_file(file), file.string());
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    const std::string what = e.what();
    EXPECT_LT(what.size(), 700u) << what;
    EXPECT_NE(what.find("unexpected [12.bias, 12.weight, 13.bias, 13.weight, 14.bias, 14.weight, "
                        "15.bias, 15.weight, ... (48 more)]"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("; ... (20 more)"), std::string::npos) << what;  // 24 shapes differ
  }
}

// Integer tensors for floating parameters (an I32 file of the right shapes) are refused: copied by
// value they made a NaN loss from the first step. Floating dtypes still convert.
TEST_F(StateDictTest, IntegerTensorsAreRefusedForFloatingParameters) {
  torch::nn::Linear model(3, 2);
  fabric::StateDict ints = {{"weight", torch::ones({2, 3}, torch::kInt)},
                            {"bias", torch::ones({2}, torch::kInt)}};
  try {
    fabric::load_state_dict(*model, ints, "ints.safetensors");
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "ints.safetensors: does not match the model: weight is Int in the file, a "
              "floating-point Float in the model (not weights of this model?); bias is Int in "
              "the file, a floating-point Float in the model (not weights of this model?)");
  }
  fabric::StateDict halves = {{"weight", torch::ones({2, 3}, torch::kHalf)},
                              {"bias", torch::zeros({2}, torch::kDouble)}};
  fabric::load_state_dict(*model, halves, "halves");
  EXPECT_TRUE(model->weight.equal(torch::ones({2, 3})));
}

std::string describe(const torch::Tensor& t) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), "%lld %.6e", static_cast<long long>(t.numel()),
                t.to(torch::kDouble).sum().item<double>());
  return buf;
}

// Python printed "T name numel sum" per tensor (kPrintRows): every tensor of `ours` must match.
void expect_rows_match(const std::string& out, const fabric::StateDict& ours) {
  std::map<std::string, std::string> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("T ", 0) != 0) continue;
    const size_t space = line.find(' ', 2);
    rows[line.substr(2, space - 2)] = line.substr(space + 1);
  }
  EXPECT_EQ(rows.size(), ours.size()) << out;
  for (const auto& [name, t] : ours) EXPECT_EQ(rows[name], describe(t)) << name;
}

constexpr const char* kPrintRows =
    "for k, v in sd.items():\n"
    "    print('T', k, v.numel(), '%.6e' % v.double().sum().item())\n";

TEST_F(StateDictTest, MapNamesRenamesDropsAndRefusesCollisions) {
  torch::manual_seed(6);
  auto model = make_model();
  fabric::StateDict foreign;  // another program's names: "net." prefix, plus an extra entry
  for (const auto& [name, t] : fabric::state_dict(*model)) foreign.emplace_back("net." + name, t);
  foreign.emplace_back("extra.step", torch::ones(1));
  auto fresh = make_model();
  const auto mapped = fabric::map_names(foreign, [](const std::string& n) {
    return n.rfind("net.", 0) == 0 ? n.substr(4) : std::string();  // "" drops extra.step
  });
  fabric::load_state_dict(*fresh, mapped, "mapped");
  const auto a = fabric::state_dict(*model), b = fabric::state_dict(*fresh);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].second, b[i].second));
  try {
    fabric::map_names(foreign, [](const std::string&) { return std::string("same"); });
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "map_names: 'net.0.weight' and 'net.0.bias' both map to 'same'");
  }
}

TEST_F(StateDictTest, PythonReadsOurFileWithWeightsOnly) {
  torch::manual_seed(1);
  auto model = make_model();
  const fs::path file = dir_ / "for_python.pt";
  fabric::save_state_dict(file, fabric::state_dict(*model));
  auto [code, out] = run_python(std::string("import sys, torch\n"
                                            "sd = torch.load(sys.argv[1], weights_only=True)\n"
                                            "assert type(sd) is dict, type(sd)\n") +
                                    kPrintRows,
                                file);
  ASSERT_EQ(code, 0) << out;
  expect_rows_match(out, fabric::state_dict(*model));
}

TEST_F(StateDictTest, WeLoadPythonsTorchSaveOfAStateDict) {
  const fs::path file = dir_ / "from_python.pt";
  auto [code, out] = run_python(
      std::string("import sys, torch\n"
                  "torch.manual_seed(2)\n"
                  "m = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.BatchNorm2d(4),\n"
                  "                        torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))\n"
                  "m(torch.randn(2, 1, 8, 8))\n"
                  "sd = m.state_dict()\n"
                  "torch.save(sd, sys.argv[1])\n") +
          kPrintRows,
      file);
  ASSERT_EQ(code, 0) << out;
  auto model = make_model();
  fabric::load_state_dict(*model, fabric::load_state_dict_file(file), file.string());
  expect_rows_match(out, fabric::state_dict(*model));
}

TEST_F(StateDictTest, APickleNamingCodeIsRefusedNotRun) {
  const fs::path file = dir_ / "evil.pt";
  auto [code, out] = run_python(
      "import sys, os, torch\n"
      "torch.save({'w': torch.ones(2), 'x': os.system}, sys.argv[1])\n",
      file);
  ASSERT_EQ(code, 0) << out;
  try {
    fabric::load_state_dict_file(file);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("refers to posix.system, which plain data never needs"),
              std::string::npos)
        << e.what();
  }
}

// torch.load keeps an expand()ed tensor (stride 0) a view of its small storage; so do we: a
// 1 KB file naming 2^40 elements loads without materialising them (it was cloned: 4 TiB), and
// a tensor whose sizes and strides overflow 64 bits when multiplied is refused, not wrapped.
TEST_F(StateDictTest, StrideZeroViewsStayViewsAndOverflowingShapesAreRefused) {
  const fs::path file = dir_ / "expand.pt";
  auto [code, out] = run_python(
      "import sys, torch\n"
      "row = torch.arange(4.0)\n"
      "torch.save({'wide': row.expand(1 << 20, 4), 'huge': row[:1].expand(1 << 40)}, "
      "sys.argv[1])\n",
      file);
  ASSERT_EQ(code, 0) << out;
  const fabric::StateDict loaded = fabric::load_state_dict_file(file);
  ASSERT_EQ(loaded.size(), 2u);
  for (const auto& [name, t] : loaded) {
    EXPECT_EQ(t.stride(0), 0) << name;
    EXPECT_LE(t.storage().nbytes(), 64u) << name;
  }
  EXPECT_EQ(loaded[1].second.numel(), int64_t{1} << 40);
  EXPECT_TRUE(loaded[0].second.equal(torch::arange(4.0).expand({1 << 20, 4})));

  const fs::path evil = dir_ / "overflow.pt";
  auto [code2, out2] = run_python(
      "import sys, torch, collections, warnings\n"
      "warnings.simplefilter('ignore')\n"
      "class Evil:\n"
      "    def __init__(self, storage): self.storage = storage\n"
      "    def __reduce__(self):\n"
      "        return (torch._utils._rebuild_tensor_v2,\n"
      "                (self.storage, 0, (1 << 62,), (4,), False, collections.OrderedDict()))\n"
      "torch.save({'x': Evil(torch.zeros(4).storage())}, sys.argv[1])\n",
      evil);
  ASSERT_EQ(code2, 0) << out2;
  try {
    fabric::load_state_dict_file(evil);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor shape exceeds its storage"), std::string::npos)
        << e.what();
  }
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
  EXPECT_EQ(message(dir_ / "random.pt")
                .rfind((dir_ / "random.pt").string() + ": not a readable PyTorch file (", 0),
            0u)
      << message(dir_ / "random.pt");
  // JSON or other text (a meta.json given as weights): said so, not the zip reader's words.
  std::ofstream(dir_ / "meta.json") << "{\"vocab_size\": 65}\n";
  EXPECT_EQ(message(dir_ / "meta.json"),
            (dir_ / "meta.json").string() +
                ": not a readable PyTorch file (it is JSON text, not torch.save's zip archive)");
  std::ofstream(dir_ / "notes.pt") << "some notes\n";
  EXPECT_EQ(message(dir_ / "notes.pt"),
            (dir_ / "notes.pt").string() +
                ": not a readable PyTorch file (it is text, not torch.save's zip archive)");
  // A truncated file (the first half of a good one).
  fabric::save_state_dict(dir_ / "good.pt", fabric::state_dict(*make_model()));
  std::ifstream in(dir_ / "good.pt", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(dir_ / "truncated.pt", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  EXPECT_EQ(message(dir_ / "truncated.pt")
                .rfind((dir_ / "truncated.pt").string() + ": not a readable", 0),
            0u)
      << message(dir_ / "truncated.pt");
  EXPECT_EQ(message(dir_ / "truncated.pt").find('\n'), std::string::npos);
  // One bit flipped in a weight (same size, the zip intact): its record's CRC-32 names it.
  const torch::Tensor first = fabric::state_dict(*make_model()).front().second;
  fabric::save_state_dict(dir_ / "good.pt", {{"w", first}});
  std::ifstream good(dir_ / "good.pt", std::ios::binary);
  std::string saved((std::istreambuf_iterator<char>(good)), std::istreambuf_iterator<char>());
  const size_t at = saved.find(std::string(static_cast<const char*>(first.data_ptr()),
                                           first.numel() * first.element_size()));
  ASSERT_NE(at, std::string::npos);
  saved[at + 1] = static_cast<char>(saved[at + 1] ^ 0x01);
  std::ofstream(dir_ / "flipped.pt", std::ios::binary) << saved;
  EXPECT_EQ(message(dir_ / "flipped.pt"),
            (dir_ / "flipped.pt").string() +
                ": not a readable PyTorch file (record data/0 fails its CRC-32 check: damaged)");
  // Writing where a folder cannot exist: the error names the file; nothing is left behind.
  std::ofstream(dir_ / "plainfile") << "x";
  try {
    fabric::save_state_dict(dir_ / "plainfile" / "w.pt", {});
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "cannot write " + (dir_ / "plainfile" / "w.pt").string() + ": ", 0),
              0u)
        << e.what();
  }
}

}  // namespace
