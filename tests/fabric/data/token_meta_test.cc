// The meta.json checks of fabric/data/tokens.h: meta.json's fields checked for type and sign, its
// token counts against the files (a factor of two names the other data.token_dtype), its
// vocab_size against the ids, its BPE files and vocabulary, and a prompt's ids against both
// vocabularies; and the token reader's own hints for a file read at the wrong width. Each error is
// one line naming the file, the field and the fix.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/data/bpe.h"
#include "fabric/data/tokens.h"

namespace fs = std::filesystem;

namespace {

const fs::path kBpe = "tests/fabric/data/testdata/bpe";

// A fresh folder for one test.
fs::path folder(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / "token_meta" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

void write_tokens(const fs::path& file, const std::vector<uint32_t>& ids, int width) {
  std::ofstream out(file, std::ios::binary);
  for (uint32_t v : ids)
    for (int b = 0; b < width; ++b) out.put(static_cast<char>((v >> (8 * b)) & 0xff));
}

// DIR with train.bin (`train` ids) and val.bin (40 ids) of `width` bytes, and `meta` as meta.json.
fs::path data(const std::string& name, const std::string& meta, int width = 2,
              const std::vector<uint32_t>& train = std::vector<uint32_t>(100, 7)) {
  const fs::path dir = folder(name);
  write_tokens(dir / "train.bin", train, width);
  write_tokens(dir / "val.bin", std::vector<uint32_t>(40, 9), width);
  std::ofstream(dir / "meta.json") << meta;
  return dir;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string meta_error(const std::string& text) {
  return error_of([&] { fabric::parse_token_meta(text, "d/meta.json"); });
}

TEST(TokenMetaTest, FieldsOfTheWrongTypeOrSignAreOneLineNamingTheField) {
  const std::string vocab_fix =
      "write the tokenizer's vocabulary size (its largest id + 1), or prepare the data again "
      "with tools/prepare_text";
  // Before: -5 was ignored, 300.5 accepted, and the string "256" was called "not JSON".
  EXPECT_EQ(meta_error(R"({"vocab_size": -5})"),
            "d/meta.json: \"vocab_size\" is -5, below 1; " + vocab_fix);
  EXPECT_EQ(meta_error(R"({"vocab_size": 300.5})"),
            "d/meta.json: \"vocab_size\" is 300.5, not a whole number; " + vocab_fix);
  EXPECT_EQ(meta_error(R"({"vocab_size": "256"})"),
            "d/meta.json: \"vocab_size\" is the string \"256\", not a number; write it without "
            "the quotes (256)");
  EXPECT_EQ(meta_error(R"({"vocab_size": "many"})"),
            "d/meta.json: \"vocab_size\" is the string \"many\", not a whole number; " + vocab_fix);
  EXPECT_EQ(meta_error(R"({"vocab_size": 0})"),
            "d/meta.json: \"vocab_size\" is 0, below 1; " + vocab_fix);
  EXPECT_EQ(meta_error(R"({"train_tokens": -1})"),
            "d/meta.json: \"train_tokens\" is -1, below 0; write the file's token count (its "
            "size / 2 for uint16 ids), or prepare the data again with tools/prepare_text");
  EXPECT_EQ(meta_error(R"({"val_tokens": true})").rfind("d/meta.json: \"val_tokens\" is true, ", 0),
            0u);
  EXPECT_EQ(meta_error(R"({"tokenizer": 3})")
                .rfind("d/meta.json: \"tokenizer\" is 3, not a "
                       "string; write \"bytes\", \"gpt2-bpe\" or \"hf-tokenizer\"",
                       0),
            0u);
  EXPECT_EQ(meta_error("[256]").rfind("d/meta.json: not a JSON object", 0), 0u);
  EXPECT_EQ(meta_error("{\"vocab_size\": 25").rfind("d/meta.json: not JSON (", 0), 0u);
  // What tools/prepare_text writes, and a whole number written with a point, are read.
  const auto m = fabric::parse_token_meta(
      R"({"tokenizer": "bytes", "vocab_size": 256.0, "train_tokens": 90, "val_tokens": 10})",
      "d/meta.json");
  EXPECT_EQ(m.vocab_size, 256);
  EXPECT_EQ(m.train_tokens, 90);
  EXPECT_EQ(m.val_tokens, 10);
  EXPECT_EQ(fabric::parse_token_meta("{}", "d/meta.json").train_tokens, -1);
}

TEST(TokenMetaTest, Gpt2BpeWithoutItsFilesNamesTheMissingField) {
  // Before: a sample after training said "the BPE files meta.json names are gone: , ".
  EXPECT_EQ(meta_error(R"({"tokenizer": "gpt2-bpe", "vocab_size": 700, "vocab": "/v.json"})"),
            "d/meta.json: \"tokenizer\": \"gpt2-bpe\" without \"merges\" (the path of the "
            "tokenizer's merges.txt); add it, or prepare the data again with tools/prepare_text "
            "--vocab=vocab.json --merges=merges.txt");
  EXPECT_NE(meta_error(R"({"tokenizer": "gpt2-bpe"})").find("without \"vocab\""),
            std::string::npos);
  // A relative path is meta.json's folder's.
  const auto m = fabric::parse_token_meta(
      R"({"tokenizer": "gpt2-bpe", "vocab": "v.json", "merges": "/abs/m.txt"})", "d/meta.json");
  EXPECT_EQ(m.vocab, fs::path("d/v.json"));
  EXPECT_EQ(m.merges, fs::path("/abs/m.txt"));
}

TEST(TokenMetaTest, ACountThatIsTheOtherWidthNamesTheDtypeToSet) {
  const std::string meta = R"({"tokenizer": "bytes", "vocab_size": 256, "train_tokens": 100,
                               "val_tokens": 40})";
  // uint16 files read as uint32. Before: "token 458759 ... raise model.vocab_size".
  const fs::path u16 = data("u16", meta, 2);
  EXPECT_EQ(error_of([&] {
              fabric::open_token_splits(u16, fabric::read_token_meta(u16),
                                        {.block_size = 8, .token_bytes = 4, .vocab_size = 256});
            }),
            (u16 / "meta.json").string() + ": \"train_tokens\" is 100, the 200 bytes of " +
                (u16 / "train.bin").string() +
                " as uint16 ids, but data.token_dtype reads uint32; set data.token_dtype=uint16");
  // uint32 files read as uint16. Before: trained on ids of which every second one was 0.
  const fs::path u32 = data("u32", meta, 4);
  EXPECT_EQ(error_of([&] {
              fabric::open_token_splits(u32, fabric::read_token_meta(u32),
                                        {.block_size = 8, .token_bytes = 2, .vocab_size = 256});
            }),
            (u32 / "meta.json").string() + ": \"train_tokens\" is 100, the 400 bytes of " +
                (u32 / "train.bin").string() +
                " as uint32 ids, but data.token_dtype reads uint16; set data.token_dtype=uint32");
  // Another count altogether (val.bin: 40 tokens, meta.json says 41).
  const fs::path off = data("off", R"({"train_tokens": 100, "val_tokens": 41})", 2);
  EXPECT_EQ(error_of([&] {
              fabric::open_token_splits(off, fabric::read_token_meta(off), {.block_size = 8});
            }),
            (off / "meta.json").string() + ": \"val_tokens\" is 41, but " +
                (off / "val.bin").string() +
                " has 80 bytes (40 uint16 ids); write its count (bytes / 2) there, or prepare "
                "the data again with tools/prepare_text");
  // Right counts: both splits open.
  const fs::path good = data("good", meta, 2);
  const auto splits =
      fabric::open_token_splits(good, fabric::read_token_meta(good), {.block_size = 8});
  EXPECT_EQ(splits.train->tokens(), 100);
  EXPECT_EQ(splits.val->tokens(), 40);
}

TEST(TokenMetaTest, IdsAreCheckedAgainstTheUnpaddedVocabulary) {
  // 700 ids, a model padded to 704: id 701 passed before.
  std::vector<uint32_t> ids(100, 5);
  ids[60] = 701;
  const fs::path dir = data("vocab", R"({"vocab_size": 700})", 2, ids);
  EXPECT_EQ(error_of([&] {
              fabric::open_token_splits(dir, fabric::read_token_meta(dir),
                                        {.block_size = 8, .vocab_size = 704});
            }),
            (dir / "train.bin").string() + ": token 701 at token offset 60 (byte 120) is not " +
                "below the \"vocab_size\" of " + (dir / "meta.json").string() +
                ", 700; write the tokenizer's vocabulary size there (its largest id + 1), or " +
                "prepare the data again with tools/prepare_text");
  // A smaller model.vocab_size is the one named.
  EXPECT_NE(error_of([&] {
              fabric::open_token_splits(dir, fabric::read_token_meta(dir),
                                        {.block_size = 8, .vocab_size = 600});
            }).find("is not below model.vocab_size 600; prepare the data with this model's"),
            std::string::npos);
}

// val.bin a link to train.bin (symbolic or hard): validation on the training data, refused.
TEST(TokenMetaTest, AValBinLinkedToTrainBinIsRefused) {
  for (const bool hard : {false, true}) {
    const fs::path dir = folder(hard ? "hard_link" : "sym_link");
    std::vector<uint32_t> ids(200, 7);
    write_tokens(dir / "train.bin", ids, 2);
    fs::remove(dir / "val.bin");
    if (hard)
      fs::create_hard_link(dir / "train.bin", dir / "val.bin");
    else
      fs::create_symlink("train.bin", dir / "val.bin");
    EXPECT_EQ(error_of([&] {
                fabric::open_token_splits(dir, fabric::read_token_meta(dir), {.block_size = 8});
              }),
              (dir / "val.bin").string() +
                  ": is the same file as train.bin (a link to it): the validation loss would be "
                  "measured on the training data; write val.bin with tools/prepare_text")
        << hard;
  }
}

TEST(TokenMetaTest, WithoutMetaTheReaderNamesTheOtherWidth) {
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 200; ++i) ids.push_back(1 + i % 250);
  const fs::path dir = folder("bare");
  // uint16 ids read as uint32: an id over 65,535 under a vocabulary of 50,304.
  write_tokens(dir / "u16.bin", ids, 2);
  const std::string wide = error_of([&] {
    fabric::TokenDataset::open((dir / "u16.bin").string(),
                               {.block_size = 8, .token_bytes = 4, .vocab_size = 50304});
  });
  EXPECT_NE(wide.find("is not below model.vocab_size 50304; uint16 ids read as uint32? set "
                      "data.token_dtype=uint16"),
            std::string::npos)
      << wide;
  // uint32 ids read as uint16: every second id is 0.
  write_tokens(dir / "u32.bin", ids, 4);
  EXPECT_EQ(
      error_of([&] { fabric::TokenDataset::open((dir / "u32.bin").string(), {.block_size = 8}); }),
      (dir / "u32.bin").string() +
          ": every second uint16 id is 0, as uint32 ids read as uint16 give; set "
          "data.token_dtype=uint32");
}

TEST(TokenMetaTest, TheBpeFilesAndVocabularyAreCheckedAgainstMeta) {
  const std::string files = ", \"vocab\": \"" + fs::absolute(kBpe / "vocab.json").string() +
                            "\", \"merges\": \"" + fs::absolute(kBpe / "merges.txt").string() +
                            "\"}";
  const auto good =
      fabric::parse_token_meta(R"({"tokenizer": "gpt2-bpe", "vocab_size": 700)" + files, "m.json");
  EXPECT_EQ(fabric::load_meta_tokenizer(good).vocab_size(), 700);
  const auto wrong =
      fabric::parse_token_meta(R"({"tokenizer": "gpt2-bpe", "vocab_size": 500)" + files, "m.json");
  EXPECT_EQ(error_of([&] { fabric::load_meta_tokenizer(wrong); }),
            "m.json: \"vocab_size\" is 500, but " + fs::absolute(kBpe / "vocab.json").string() +
                " holds ids up to 699 (vocabulary size 700); write 700 there, or prepare the data "
                "again with tools/prepare_text");
  const auto gone = fabric::parse_token_meta(
      R"({"tokenizer": "gpt2-bpe", "vocab": "/gone/vocab.json", "merges": "/gone/m.txt"})",
      "m.json");
  EXPECT_EQ(error_of([&] { fabric::load_meta_tokenizer(gone); }),
            "m.json: \"vocab\" names /gone/vocab.json, which does not exist; restore it or "
            "correct the path");
}

TEST(TokenMetaTest, APromptsIdsAreCheckedAgainstBothVocabularies) {
  const auto bytes =
      fabric::parse_token_meta(R"({"tokenizer": "bytes", "vocab_size": 256})", "m.json");
  EXPECT_EQ(fabric::encode_checked(bytes, nullptr, "def", 256, "gpt.prompt"),
            (std::vector<int64_t>{'d', 'e', 'f'}));
  // Before: "index out of range in self" when sampling, after training.
  EXPECT_EQ(
      error_of([&] { fabric::encode_checked(bytes, nullptr, "d\xc3\xa9", 128, "gpt.prompt"); }),
      "gpt.prompt: byte 1 of 'd\xc3\xa9' is id 195, not below model.vocab_size 128; change "
      "gpt.prompt, or raise model.vocab_size");
  const auto ascii =
      fabric::parse_token_meta(R"({"tokenizer": "bytes", "vocab_size": 128})", "m.json");
  EXPECT_EQ(
      error_of([&] { fabric::encode_checked(ascii, nullptr, "\xc3\xa9", 192, "gpt.prompt"); }),
      "gpt.prompt: byte 0 of '\xc3\xa9' is id 195, not below the \"vocab_size\" 128 of "
      "m.json; change gpt.prompt to text of the data's vocabulary");
  const auto bpe_meta = fabric::parse_token_meta(
      R"({"tokenizer": "gpt2-bpe", "vocab_size": 700, "vocab": ")" +
          fs::absolute(kBpe / "vocab.json").string() + R"(", "merges": ")" +
          fs::absolute(kBpe / "merges.txt").string() + "\"}",
      "m.json");
  const auto bpe = fabric::load_meta_tokenizer(bpe_meta);
  EXPECT_EQ(fabric::encode_checked(bpe_meta, &bpe, "def", 704, "gpt.prompt"), bpe.encode("def"));
  EXPECT_NE(error_of([&] { fabric::encode_checked(bpe_meta, &bpe, "def", 64, "gpt.prompt"); })
                .find("not below model.vocab_size 64; change gpt.prompt, or raise "
                      "model.vocab_size"),
            std::string::npos);
}

}  // namespace
