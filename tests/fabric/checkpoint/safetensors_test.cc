// .safetensors files: Python's `safetensors` package reads ours and we read its, bit for bit, for
// every dtype both sides know; the metadata both ways; weights through save_state_dict /
// load_state_dict_file by the file's name and contents; one-line errors for broken files.
#include "fabric/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/error.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

// Every dtype with a safetensors name, by that name, and the shape its test tensor has.
const std::vector<std::pair<std::string, torch::ScalarType>> kDtypes = {
    {"BOOL", torch::kBool},
    {"U8", torch::kByte},
    {"I8", torch::kChar},
    {"I16", torch::kShort},
    {"U16", torch::kUInt16},
    {"I32", torch::kInt},
    {"U32", torch::kUInt32},
    {"I64", torch::kLong},
    {"U64", torch::kUInt64},
    {"F16", torch::kHalf},
    {"BF16", torch::kBFloat16},
    {"F32", torch::kFloat},
    {"F64", torch::kDouble},
    {"C64", torch::kComplexFloat},
    {"F8_E4M3", torch::kFloat8_e4m3fn},
    {"F8_E5M2", torch::kFloat8_e5m2},
    {"F8_E8M0", torch::kFloat8_e8m0fnu},
};

// Python: the same table, and "T name shape hex" per tensor of a dict `sd`.
constexpr const char* kPythonDtypes =
    "import sys, torch\n"
    "DT = {'BOOL': torch.bool, 'U8': torch.uint8, 'I8': torch.int8, 'I16': torch.int16,\n"
    "      'U16': torch.uint16, 'I32': torch.int32, 'U32': torch.uint32, 'I64': torch.int64,\n"
    "      'U64': torch.uint64, 'F16': torch.float16, 'BF16': torch.bfloat16,\n"
    "      'F32': torch.float32, 'F64': torch.float64, 'C64': torch.complex64,\n"
    "      'F8_E4M3': torch.float8_e4m3fn, 'F8_E5M2': torch.float8_e5m2,\n"
    "      'F8_E8M0': torch.float8_e8m0fnu}\n"
    "def rows(sd):\n"
    "    for k in sorted(sd):\n"
    "        v = sd[k].contiguous()\n"
    "        raw = v.reshape(-1).view(torch.uint8).numpy().tobytes() if v.numel() else b''\n"
    "        print('T', k, 'x'.join(map(str, v.shape)) or '-', raw.hex())\n";

std::string row(const std::string& name, const torch::Tensor& t) {
  std::string shape;
  for (const auto d : t.sizes()) shape += (shape.empty() ? "" : "x") + std::to_string(d);
  const auto c = t.contiguous();
  const auto* bytes = static_cast<const unsigned char*>(c.const_data_ptr());
  std::string hex;
  char buf[3];
  for (size_t i = 0; i < c.nbytes(); ++i) {
    std::snprintf(buf, sizeof buf, "%02x", bytes[i]);
    hex += buf;
  }
  return "T " + name + " " + (shape.empty() ? "-" : shape) + " " + hex;
}

std::map<std::string, std::string> rows_of(const std::string& out) {
  std::map<std::string, std::string> rows;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("T ", 0) == 0) rows[line.substr(2, line.find(' ', 2) - 2)] = line;
  return rows;
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fs::path(::testing::TempDir()); }
  fs::path dir_;

  fabric::testing::CommandResult run_python(const std::string& program, const fs::path& file) {
    return fabric::testing::run_python(program, dir_, file.string());
  }

  // The error load_safetensors gives for `file` ("" if none).
  static std::string error_for_existing(const fs::path& file) {
    try {
      fabric::load_safetensors(file);
    } catch (const fabric::Error& e) {
      return e.what();
    }
    return "";
  }

  // Writes `bytes` as a file and returns the error load_safetensors gives for it ("" if none).
  std::string error_for(const std::string& name, const std::string& bytes) {
    const fs::path file = dir_ / name;
    std::ofstream(file, std::ios::binary) << bytes;
    try {
      fabric::load_safetensors(file);
    } catch (const fabric::Error& e) {
      return e.what();
    }
    return "";
  }
};

// A file by hand: header length, header, data.
std::string file_bytes(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

TEST_F(SafetensorsTest, PythonReadsOursBitForBit) {
  torch::manual_seed(3);
  fabric::StateDict tensors;
  for (const auto& [name, type] : kDtypes) {
    const int64_t size = c10::elementSize(type);
    const auto bytes = type == torch::kBool ? torch::randint(0, 2, {2 * 3}, torch::kUInt8)
                                            : torch::randint(0, 256, {2 * 3 * size}, torch::kUInt8);
    tensors.emplace_back(name, bytes.view(type).reshape({2, 3}));
  }
  tensors.emplace_back("scalar", torch::tensor(2.5));
  tensors.emplace_back("empty", torch::zeros({0, 4}));
  tensors.emplace_back("strided", torch::arange(12, torch::kFloat).reshape({3, 4}).t());
  const fs::path file = dir_ / "ours.safetensors";
  fabric::save_safetensors(file, tensors, {{"format", "pt"}, {"step", "7"}});

  auto [code, out] =
      run_python(std::string(kPythonDtypes) +
                     "from safetensors import safe_open\n"
                     "from safetensors.torch import load_file\n"
                     "rows(load_file(sys.argv[1]))\n"
                     "with safe_open(sys.argv[1], 'pt') as f:\n"
                     "    print('M', sorted(f.metadata().items()))\n"
                     "    for k in f.keys():\n"
                     "        if k in DT: assert f.get_tensor(k).dtype == DT[k], k\n",
                 file);
  ASSERT_EQ(code, 0) << out;
  const auto rows = rows_of(out);
  EXPECT_EQ(rows.size(), tensors.size()) << out;
  for (const auto& [name, t] : tensors) EXPECT_EQ(rows.at(name), row(name, t));
  EXPECT_NE(out.find("M [('format', 'pt'), ('step', '7')]"), std::string::npos) << out;
}

TEST_F(SafetensorsTest, WeReadPythonsBitForBit) {
  const fs::path file = dir_ / "theirs.safetensors";
  auto [code, out] =
      run_python(std::string(kPythonDtypes) +
                     "from safetensors.torch import save_file\n"
                     "torch.manual_seed(4)\n"
                     "sd = {}\n"
                     "for name, dt in DT.items():\n"
                     "    size = torch.empty(0, dtype=dt).element_size()\n"
                     "    raw = torch.randint(0, 2 if dt == torch.bool else 256, (5 * size,),\n"
                     "                        dtype=torch.uint8)\n"
                     "    sd[name] = raw.view(dt).reshape(5, 1)\n"
                     "sd['scalar'] = torch.tensor(-1.25, dtype=torch.float64)\n"
                     "save_file(sd, sys.argv[1], metadata={'source': 'python'})\n"
                     "rows(sd)\n",
                 file);
  ASSERT_EQ(code, 0) << out;
  const auto theirs = fabric::load_safetensors(file);
  const auto rows = rows_of(out);
  EXPECT_EQ(theirs.tensors.size(), rows.size());
  for (const auto& [name, t] : theirs.tensors) {
    EXPECT_EQ(row(name, t), rows.at(name));
    EXPECT_TRUE(t.device().is_cpu());
  }
  EXPECT_EQ(theirs.metadata, (std::map<std::string, std::string>{{"source", "python"}}));

  // The tensors view the mapped file copy-on-write: writing one leaves the file as it was.
  auto f32 = std::find_if(theirs.tensors.begin(), theirs.tensors.end(), [](const auto& e) {
               return e.first == "F32";
             })->second;
  f32.fill_(0);
  const auto again = fabric::load_safetensors(file);
  for (const auto& [name, t] : again.tensors) EXPECT_EQ(row(name, t), rows.at(name));
}

TEST_F(SafetensorsTest, WeightsFilesChooseTheFormatByNameAndContents) {
  torch::manual_seed(5);
  auto model = torch::nn::Sequential(torch::nn::Conv2d(1, 4, 3), torch::nn::BatchNorm2d(4));
  const auto sd = fabric::state_dict(*model);
  const fs::path st = dir_ / "weights.safetensors", pt = dir_ / "weights.pt";
  fabric::save_state_dict(st, sd);
  fabric::save_state_dict(pt, sd);
  std::ifstream in(st, std::ios::binary);
  std::string head(9, '\0');
  in.read(head.data(), 9);
  EXPECT_TRUE(fabric::looks_like_safetensors(head));
  // Read by contents, whatever the name: a safetensors file renamed .pt still loads.
  fs::copy_file(st, dir_ / "renamed.pt", fs::copy_options::overwrite_existing);
  for (const fs::path& file : {st, pt, dir_ / "renamed.pt"}) {
    auto fresh = torch::nn::Sequential(torch::nn::Conv2d(1, 4, 3), torch::nn::BatchNorm2d(4));
    fabric::load_state_dict(*fresh, fabric::load_state_dict_file(file), file.string());
    const auto got = fabric::state_dict(*fresh);
    ASSERT_EQ(got.size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i)
      EXPECT_TRUE(torch::equal(got[i].second, sd[i].second)) << file << " " << sd[i].first;
  }
}

// A FIFO is neither sniffed nor opened (either would wait for a writer forever): the error says
// what it is.
TEST_F(SafetensorsTest, AFifoIsRefusedNotWaitedOn) {
  const fs::path fifo = dir_ / "pipe.safetensors";
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(fabric::is_safetensors_file(fifo));
  EXPECT_EQ(error_for_existing(fifo),
            fifo.string() + ": cannot open (a FIFO (named pipe), not a regular file)");
  try {
    fabric::load_state_dict_file(fifo);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              fifo.string() + ": cannot open (a FIFO (named pipe), not a regular file)");
  }
}

TEST_F(SafetensorsTest, BrokenFilesAreOneLineErrors) {
  const std::string ok_header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string data(8, '\0');
  EXPECT_EQ(error_for("good.safetensors", file_bytes(ok_header, data)), "");

  const auto has = [](const std::string& error, const std::string& part) {
    return error.find(part) != std::string::npos;
  };
  auto e = error_for("short.safetensors", "abc");
  EXPECT_TRUE(has(e, "short.safetensors: not a safetensors file (3 bytes")) << e;
  e = error_for("truncated.safetensors", file_bytes(ok_header, data).substr(0, 30));
  EXPECT_TRUE(has(e, "truncated.safetensors: not a safetensors file (its header length")) << e;
  e = error_for("notjson.safetensors", file_bytes("{\"w\": oops}", ""));
  EXPECT_TRUE(has(e, "notjson.safetensors: the safetensors header is not JSON")) << e;
  e = error_for("zip.safetensors", "PK\3\4 not a header at all");
  EXPECT_TRUE(has(e, "zip.safetensors: not a safetensors file")) << e;
  e = error_for("f4.safetensors",
                file_bytes(R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", "x"));
  EXPECT_TRUE(has(e, "f4.safetensors: tensor 'w': dtype F4 has no torch dtype (readable: BOOL"))
      << e;
  e = error_for("size.safetensors",
                file_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data));
  EXPECT_TRUE(has(e, "tensor 'w': data_offsets [0,8] hold 8 bytes, but shape [3] of F32 needs 12"))
      << e;
  e = error_for("gap.safetensors",
                file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data));
  EXPECT_TRUE(has(e, "tensor 'w' starts at byte 4 of the data, where a gap of 4 bytes precedes it"))
      << e;
  e = error_for("overlap.safetensors",
                file_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           data));
  EXPECT_TRUE(has(e, "tensor 'b' starts at byte 4 of the data, where it overlaps")) << e;
  // A shape whose byte size overflows 64 bits (2^62 x 2^2 F32 elements x 4 bytes = 2^66) must not
  // wrap around to the 0-byte range it claims (Python's safetensors refuses it too).
  e = error_for("overflow.safetensors",
                file_bytes(R"({"w":{"dtype":"F32","shape":[4611686018427387904,4],)"
                           R"("data_offsets":[0,0]}})",
                           ""));
  EXPECT_TRUE(has(e,
                  "overflow.safetensors: tensor 'w': shape [4611686018427387904, 4] of F32 is "
                  "too large: its size overflows 64 bits"))
      << e;
  e = error_for("huge.safetensors",
                file_bytes(R"({"w":{"dtype":"F32","shape":[18446744073709551615],)"
                           R"("data_offsets":[0,0]}})",
                           ""));
  EXPECT_TRUE(has(e, "huge.safetensors: tensor 'w': shape [18446744073709551615] is not sizes"))
      << e;
  // A name given twice (the JSON parser keeps one entry; the other's bytes looked like a gap).
  e = error_for("twice.safetensors",
                file_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           data));
  EXPECT_TRUE(has(e, "twice.safetensors: the safetensors header names 'w' twice")) << e;
  e = error_for("tail.safetensors", file_bytes(ok_header, data + "zz"));
  EXPECT_TRUE(has(e, "the tensors' data end at byte 8 but the file holds 10 bytes of data")) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;

  // Writing: an unsupported dtype and a duplicate name are refused before anything is written.
  const fs::path out = dir_ / "refused.safetensors";
  try {
    fabric::save_safetensors(out, {{"q", torch::zeros({2}, torch::kComplexDouble)}});
    FAIL() << "no error";
  } catch (const fabric::Error& err) {
    EXPECT_TRUE(
        has(err.what(), "refused.safetensors: tensor q: dtype ComplexDouble has no safetensors"))
        << err.what();
  }
  EXPECT_THROW(fabric::save_safetensors(out, {{"a", torch::ones(1)}, {"a", torch::ones(1)}}),
               fabric::Error);
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
