// fabric::TokenDataset (nanoGPT's token files) and //tools:prepare_text: windows of block_size + 1
// tokens tiling the file, uint16 and uint32 ids, every window once per epoch through a shuffling
// loader, and each bad file one line naming it; the prep tool's files read back as the text's
// bytes.
#include "fabric/data/tokens.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/data/bpe.h"
#include "fabric/data/data_loader.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  const fs::path dir = fs::path(::testing::TempDir()) / "tokens";
  fs::create_directories(dir);
  return dir;
}

// `ids` as little-endian integers of `width` bytes.
fs::path write_tokens(const std::string& name, const std::vector<uint32_t>& ids, int width) {
  const fs::path file = scratch() / name;
  std::ofstream out(file, std::ios::binary);
  for (uint32_t v : ids)
    for (int b = 0; b < width; ++b) out.put(static_cast<char>((v >> (8 * b)) & 0xff));
  return file;
}

std::string error_of(const fs::path& file, fabric::TokenDataset::Options options) {
  try {
    fabric::TokenDataset::open(file.string(), options);
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TokenDatasetTest, WindowsTileTheFileInBothWidths) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 1000; ++i) ids.push_back(i * 7 % 300);
  for (int width : {2, 4}) {
    const auto file = write_tokens("t" + std::to_string(width) + ".bin", ids, width);
    auto d = fabric::TokenDataset::open(file.string(), {.block_size = 16, .token_bytes = width});
    EXPECT_EQ(d->tokens(), 1000);
    EXPECT_EQ(d->size(), 62);  // (1000 - 1) / 16
    const fabric::Batch b = d->get_batch({0, 5});
    ASSERT_EQ(b.data.sizes(), torch::IntArrayRef({2, 16}));
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(b.data[1][t].item<int64_t>(), ids[80 + t]);
      EXPECT_EQ(b.target[1][t].item<int64_t>(), ids[81 + t]);  // the next token
    }
  }
}

TEST(TokenDatasetTest, ALoaderReadsEveryWindowOncePerEpoch) {
  std::vector<uint32_t> ids(321);
  for (uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  auto d = fabric::TokenDataset::open(write_tokens("seq.bin", ids, 2).string(), {.block_size = 8});
  fabric::DataLoader loader(d, fabric::DataLoaderOptions().batch_size(3).shuffle(true).seed(1));
  std::multiset<int64_t> starts;
  for (fabric::Batch& b : loader)
    for (int64_t r = 0; r < b.size(); ++r) starts.insert(b.data[r][0].item<int64_t>());
  std::multiset<int64_t> want;
  for (int64_t w = 0; w < 40; ++w) want.insert(w * 8);
  EXPECT_EQ(starts, want);
}

TEST(TokenDatasetTest, BadFilesAreOneLineNamingThem) {
  const auto odd = scratch() / "odd.bin";
  std::ofstream(odd, std::ios::binary) << std::string(1001, 'a');
  EXPECT_EQ(error_of(odd, {.block_size = 4}),
            odd.string() +
                ": 1001 bytes is not a whole number of uint16 tokens (2 bytes each); "
                "a file of the other width? (data.token_dtype)");
  const auto short_file = write_tokens("short.bin", std::vector<uint32_t>(100, 1), 2);
  EXPECT_EQ(error_of(short_file, {.block_size = 256}),
            short_file.string() +
                ": 100 tokens, fewer than one window of 257 (block_size + 1); "
                "give more text or a smaller block_size");
  std::vector<uint32_t> ids(600, 3);
  ids[517] = 50304;
  const auto big = write_tokens("big.bin", ids, 2);
  EXPECT_EQ(error_of(big, {.block_size = 8, .vocab_size = 50257}),
            big.string() +
                ": token 50304 at token offset 517 (byte 1034) is not below "
                "model.vocab_size 50257; prepare the data with this model's tokenizer, "
                "or raise model.vocab_size");
  EXPECT_EQ(error_of(scratch() / "absent.bin", {}),
            (scratch() / "absent.bin").string() + ": cannot open (No such file or directory)");
}

TEST(PrepareTextTest, WritesTheBytesAsTokensSplitIntoTrainAndVal) {
  const fs::path in = scratch() / "corpus";
  fs::create_directories(in / "sub");
  std::ofstream(in / "a.txt") << std::string(900, 'x');
  std::ofstream(in / "sub" / "b.txt") << "héllo" << std::string(95, 'y');  // 101 bytes
  const fs::path out = scratch() / "prepared";
  const auto r =
      fabric::testing::run_command(fabric::testing::helper_binary("//tools:prepare_text") +
                                   " --input=" + in.string() + " --output=" + out.string());
  ASSERT_EQ(r.code, 0) << r.out;
  auto train = fabric::TokenDataset::open((out / "train.bin").string(),
                                          {.block_size = 8, .vocab_size = 256});
  auto val = fabric::TokenDataset::open((out / "val.bin").string(), {.block_size = 8});
  EXPECT_EQ(train->tokens() + val->tokens(), 1001);
  EXPECT_EQ(val->tokens(), 100);                                    // the last 10%
  EXPECT_EQ(val->get_batch({0}).data[0][0].item<int64_t>(), 0xc3);  // 'é' starts with byte 0xc3
  const auto bad = fabric::testing::run_command(
      fabric::testing::helper_binary("//tools:prepare_text") +
      " --input=" + (in / "none").string() + " --output=" + out.string());
  EXPECT_EQ(bad.code, 1) << bad.out;
  EXPECT_NE(bad.out.find((in / "none").string() + ": no such file or folder (--input)"),
            std::string::npos)
      << bad.out;
}

TEST(PrepareTextTest, WritesGpt2BpeTokensWithAnEndOfTextAfterEachFile) {
  const fs::path bpe_dir = "tests/fabric/data/testdata/bpe";
  const fs::path in = scratch() / "bpe_corpus";
  fs::create_directories(in);
  std::string a, b;
  for (int i = 0; i < 20; ++i) a += "import json\nfrom email import message_from_string\n";
  for (int i = 0; i < 20; ++i) b += "Café naïve, I'm done! 12345\n";
  std::ofstream(in / "a.txt") << a;
  std::ofstream(in / "b.txt") << b;
  const fs::path out = scratch() / "bpe_prepared";
  const auto r = fabric::testing::run_command(
      fabric::testing::helper_binary("//tools:prepare_text") + " --input=" + in.string() +
      " --output=" + out.string() + " --vocab=" + (bpe_dir / "vocab.json").string() +
      " --merges=" + (bpe_dir / "merges.txt").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto bpe = fabric::BpeTokenizer::load(bpe_dir / "vocab.json", bpe_dir / "merges.txt");
  std::vector<int64_t> want = bpe.encode(a);
  want.push_back(bpe.eot());
  for (const int64_t id : bpe.encode(b)) want.push_back(id);
  want.push_back(bpe.eot());
  std::vector<int64_t> got;
  for (const char* split : {"train.bin", "val.bin"}) {
    std::ifstream f(out / split, std::ios::binary);
    uint16_t t;
    while (f.read(reinterpret_cast<char*>(&t), 2)) got.push_back(t);
  }
  EXPECT_EQ(got, want);
  std::ifstream meta(out / "meta.json");
  const std::string text((std::istreambuf_iterator<char>(meta)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"tokenizer\": \"gpt2-bpe\", \"vocab_size\": 700"), std::string::npos)
      << text;
  const auto half = fabric::testing::run_command(
      fabric::testing::helper_binary("//tools:prepare_text") + " --input=" + in.string() +
      " --output=" + out.string() + " --vocab=" + (bpe_dir / "vocab.json").string());
  EXPECT_EQ(half.code, 2) << half.out;
  EXPECT_NE(half.out.find("--vocab and --merges go together"), std::string::npos) << half.out;
}

}  // namespace
