// fabric::BpeTokenizer gives the ids Hugging Face `tokenizers` gives with the same byte-level BPE
// files (testdata/bpe, written by make_fixture.py: contractions, runs of spaces, newlines, digits,
// punctuation, accented, Greek and Japanese letters, emoji, no-break spaces), decodes them back to
// the text, splits text as GPT-2's pattern does, and names the file and line of bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"
#include "fabric/data/bpe.h"

namespace fs = std::filesystem;

namespace {

const fs::path kDir = "tests/fabric/data/testdata/bpe";

TEST(BpeTokenizerTest, EncodesAsHuggingFaceTokenizersDoesAndDecodesBack) {
  const auto bpe = fabric::BpeTokenizer::load(kDir / "vocab.json", kDir / "merges.txt");
  EXPECT_EQ(bpe.vocab_size(), 700);
  EXPECT_EQ(bpe.eot(), 0);  // the one special token, trained first
  std::ifstream in(kDir / "expected.json");
  ASSERT_TRUE(in);
  const auto cases = nlohmann::json::parse(in);
  ASSERT_GE(cases.size(), 20u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const std::vector<int64_t> want = c["ids"];
    const std::vector<int64_t> got = bpe.encode(text);
    EXPECT_EQ(got, want) << "text: '" << text << "'";
    EXPECT_EQ(bpe.decode(got), text);
  }
  EXPECT_EQ(bpe.encode("Hello world"), bpe.encode("Hello world"));  // from the cache, the same
}

TEST(BpeTokenizerTest, SplitsAsGpt2sPattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(fabric::BpeTokenizer::pretokenize("Hello   world"), (V{"Hello", "  ", " world"}));
  EXPECT_EQ(fabric::BpeTokenizer::pretokenize("don't 'S"), (V{"don", "'t", " '", "S"}));
  EXPECT_EQ(fabric::BpeTokenizer::pretokenize("x2 3.5\n\n  y"),
            (V{"x", "2", " 3", ".", "5", "\n\n ", " y"}));
  EXPECT_EQ(fabric::BpeTokenizer::pretokenize("a \n"), (V{"a", " \n"}));
  EXPECT_EQ(fabric::BpeTokenizer::pretokenize("\nb"), (V{"\n", "b"}));
  EXPECT_EQ(fabric::BpeTokenizer::pretokenize("naïve, 日本"), (V{"naïve", ",", " 日本"}));
}

std::string error_of(const fs::path& vocab, const fs::path& merges) {
  try {
    fabric::BpeTokenizer::load(vocab, merges);
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

TEST(BpeTokenizerTest, BadFilesAreOneLineErrorsNamingFileAndLine) {
  const fs::path dir = fs::path(::testing::TempDir()) / "bpe_bad";
  fs::create_directories(dir);
  { std::ofstream(dir / "merges.txt") << "#version: 0.2\nĠ Ġ\nnot-two-symbols\n"; }
  EXPECT_EQ(error_of(kDir / "vocab.json", dir / "merges.txt"),
            (dir / "merges.txt").string() +
                ":3: expected two symbols separated by one space, got 'not-two-symbols'");
  { std::ofstream(dir / "merges.txt") << "#version: 0.2\nq z\n"; }
  EXPECT_NE(error_of(kDir / "vocab.json", dir / "merges.txt")
                .find("merges.txt:2: the merge of 'q' and 'z' is not in"),
            std::string::npos);
  { std::ofstream(dir / "vocab.json") << "{\"a\": 0}"; }
  EXPECT_NE(error_of(dir / "vocab.json", kDir / "merges.txt").find("no symbol for byte 0"),
            std::string::npos);
  EXPECT_NE(error_of(dir / "missing.json", kDir / "merges.txt").find("missing.json: cannot read"),
            std::string::npos);
  { std::ofstream(dir / "vocab.json") << "{\"a\": -1}"; }
  EXPECT_EQ(error_of(dir / "vocab.json", kDir / "merges.txt"),
            (dir / "vocab.json").string() + ": \"a\" has no integer id in [0, 2^32)");
  // Two symbols sharing an id were accepted before: the data would decode as either.
  { std::ofstream(dir / "vocab.json") << "{\"a\": 5, \"b\": 5}"; }
  EXPECT_EQ(error_of(dir / "vocab.json", kDir / "merges.txt"),
            (dir / "vocab.json").string() +
                ": \"a\" and \"b\" share id 5; each symbol needs its own id (a damaged or "
                "hand-edited vocabulary?)");
}

}  // namespace
