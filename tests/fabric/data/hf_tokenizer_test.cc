// Hugging Face tokenizer.json files run as Hugging Face `tokenizers` runs them:
// hf_tokenizer_parity.py trains GPT-2-, Llama 3- and Qwen2-style byte-level BPEs with `tokenizers`
// (merges as pairs and as strings; special, lstrip/rstrip and single_word added tokens; NFC;
// ignore_merges), has `transformers` write GPT-2's and Qwen2's files for one of them, and checks
// //tools:tokenize's ids and --decode against `tokenizers` on other text. Here too: the two new
// patterns' splits, NFC, bos/eos from the configs, prepare_text --tokenizer, and the one-line
// errors for other kinds and bad files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"
#include "fabric/data/bpe.h"
#include "fabric/data/tokens.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;
using fabric::BpeTokenizer;

namespace {

class HfTokenizerTest : public ::testing::Test {
 protected:
  // Trains the tokenizers and runs the parity check once for the suite.
  static void SetUpTestSuite() {
    dir_ = fs::path(::testing::TempDir()) / "hf_tokenizer";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    parity_ = fabric::testing::run_command(
        fabric::testing::python_interpreter() + " tests/fabric/data/hf_tokenizer_parity.py " +
        fabric::testing::helper_binary("//tools:tokenize") + " " + dir_.string());
  }
  static std::string tool_error(const std::string& tokenizer, const std::string& input = "hi",
                                const std::string& flags = "") {
    std::ofstream(dir_ / "stdin") << input;
    const auto r = fabric::testing::run_command(fabric::testing::helper_binary("//tools:tokenize") +
                                                " --tokenizer=" + tokenizer + " " + flags + " < " +
                                                (dir_ / "stdin").string());
    EXPECT_EQ(r.code, 1) << r.out;
    return r.out;
  }
  static inline fs::path dir_;
  static inline fabric::testing::CommandResult parity_;
};

TEST_F(HfTokenizerTest, IdsAndDecodingAreTokenizersOwn) {
  ASSERT_EQ(parity_.code, 0) << parity_.out
                             << "\n(needs `tokenizers`: pip install -r tools/requirements.txt)";
  EXPECT_NE(parity_.out.find("ok "), std::string::npos) << parity_.out;
}

TEST_F(HfTokenizerTest, OtherKindsAndBadFilesAreOneLineErrors) {
  ASSERT_EQ(parity_.code, 0) << parity_.out;
  const std::string only =
      " is not supported; only byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's kind) are\n";
  const std::string unigram = (dir_ / "unigram/tokenizer.json").string();
  EXPECT_EQ(tool_error(unigram), "tokenize: " + unigram +
                                     ": a Unigram model (SentencePiece's kind: T5, ALBERT, XLNet)" +
                                     only);
  const std::string wordpiece = (dir_ / "wordpiece/tokenizer.json").string();
  EXPECT_EQ(tool_error(wordpiece),
            "tokenize: " + wordpiece + ": a WordPiece model (BERT's kind)" + only);
  const std::string missing = (dir_ / "missing/tokenizer.json").string();
  EXPECT_EQ(tool_error(missing),
            "tokenize: " + missing + ": cannot read (a Hugging Face tokenizer.json)\n");
  // A model folder for its tokenizer.json, and a device that never ends (it read until memory ran
  // out): one line each.
  EXPECT_EQ(tool_error((dir_ / "gpt2").string()),
            "tokenize: " + (dir_ / "gpt2").string() +
                ": is a folder, not a Hugging Face tokenizer.json; give " +
                (dir_ / "gpt2/tokenizer.json").string() + "\n");
  EXPECT_EQ(tool_error("/dev/zero"),
            "tokenize: /dev/zero: cannot open (a character device, not a regular file)\n");
  const std::string garbled = (dir_ / "garbled.json").string();
  std::ofstream(garbled) << "{\"model\": ";
  const std::string error = tool_error(garbled);
  EXPECT_EQ(error.rfind("tokenize: " + garbled + ": not JSON (", 0), 0u) << error;
  EXPECT_NE(error.find("); give a Hugging Face tokenizer.json\n"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), error.size() - 1) << error;

  const std::string gpt2 = (dir_ / "gpt2/tokenizer.json").string();
  EXPECT_EQ(tool_error(gpt2, "a\xff"),
            "tokenize: stdin: byte 1 is not UTF-8; give UTF-8 text (or decode it first)\n");
  EXPECT_EQ(tool_error(gpt2, "1 x", "--decode"),
            "tokenize: stdin: 'x' is not a token id; give ids separated by spaces\n");
  // A pattern of another tokenizer, a normalizer of another kind.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_ / "llama3/tokenizer.json"));
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
  std::ofstream(dir_ / "other_pattern.json") << j.dump();
  EXPECT_EQ(tool_error((dir_ / "other_pattern.json").string()),
            "tokenize: " + (dir_ / "other_pattern.json").string() +
                ": pre-tokenizer pattern '\\w+' is not supported; only GPT-2's, Llama 3's and "
                "Qwen2's are\n");
  j = nlohmann::json::parse(std::ifstream(dir_ / "qwen2/tokenizer.json"));
  j["normalizer"] = {{"type", "NFKC"}};
  std::ofstream(dir_ / "nfkc.json") << j.dump();
  EXPECT_EQ(tool_error((dir_ / "nfkc.json").string()),
            "tokenize: " + (dir_ / "nfkc.json").string() +
                ": normalizer \"NFKC\" is not supported; only none and NFC are\n");
  // Fields `tokenizers` refuses: a flag that is not a boolean (read as its default, it tokenized
  // otherwise), added_tokens that is not a list, an id beyond u32 (its id + 1 overflowed).
  j = nlohmann::json::parse(std::ifstream(dir_ / "llama3/tokenizer.json"));
  j["model"]["ignore_merges"] = "yes";
  std::ofstream(dir_ / "flag.json") << j.dump();
  EXPECT_EQ(tool_error((dir_ / "flag.json").string()),
            "tokenize: " + (dir_ / "flag.json").string() +
                ": \"ignore_merges\": \"yes\" is not true or false\n");
  j = nlohmann::json::parse(std::ifstream(dir_ / "gpt2/tokenizer.json"));
  j["added_tokens"] = nlohmann::json::object();
  std::ofstream(dir_ / "added.json") << j.dump();
  EXPECT_EQ(tool_error((dir_ / "added.json").string()),
            "tokenize: " + (dir_ / "added.json").string() +
                ": \"added_tokens\" is not a list of {\"id\", \"content\", ...}\n");
  j = nlohmann::json::parse(std::ifstream(dir_ / "gpt2/tokenizer.json"));
  j["added_tokens"][0]["id"] = int64_t{1} << 40;
  std::ofstream(dir_ / "big_id.json") << j.dump();
  EXPECT_EQ(tool_error((dir_ / "big_id.json").string()),
            "tokenize: " + (dir_ / "big_id.json").string() +
                ": added_tokens[0] has no \"id\" in [0, 2^32) or no \"content\" string\n");
}

TEST_F(HfTokenizerTest, BosAndEosFromTheTokenizerAndGenerationConfigs) {
  ASSERT_EQ(parity_.code, 0) << parity_.out;
  const auto want = nlohmann::json::parse(std::ifstream(dir_ / "llama3_bos_eos.json"));
  const auto llama = BpeTokenizer::from_tokenizer_json(dir_ / "llama3/tokenizer.json");
  EXPECT_EQ(llama.bos(), want["bos"].get<int64_t>());
  EXPECT_EQ(llama.eot(), want["eos"].get<int64_t>());
  const auto qwen = BpeTokenizer::from_tokenizer_json(dir_ / "qwen2/tokenizer.json");
  EXPECT_EQ(qwen.bos(), 5);  // generation_config.json's
  EXPECT_EQ(qwen.eot(), 0);  // the first of its eos_token_id list
  const auto gpt2 = BpeTokenizer::from_tokenizer_json(dir_ / "gpt2/tokenizer.json");
  EXPECT_EQ(gpt2.bos(), -1);
  EXPECT_EQ(gpt2.eot(), 0);            // <|endoftext|>, trained first
  EXPECT_EQ(gpt2.vocab_size(), 1202);  // 1200 trained, 2 added
}

// NFC applies with and without added tokens in the file (Qwen2's normalizer).
TEST_F(HfTokenizerTest, NfcWithoutAddedTokens) {
  ASSERT_EQ(parity_.code, 0) << parity_.out;
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_ / "qwen2/tokenizer.json"));
  j["added_tokens"] = nlohmann::json::array();
  std::ofstream(dir_ / "qwen2_bare.json") << j.dump();
  const auto bare = BpeTokenizer::from_tokenizer_json(dir_ / "qwen2_bare.json");
  EXPECT_EQ(bare.encode("Cafe\u0301 A\u030a"), bare.encode("Caf\u00e9 \u00c5"));
  const auto qwen = BpeTokenizer::from_tokenizer_json(dir_ / "qwen2/tokenizer.json");
  EXPECT_EQ(bare.encode("Cafe\u0301 A\u030a"), qwen.encode("Caf\u00e9 \u00c5"));
}

// Little-endian ids of `width` bytes in `file`.
std::vector<int64_t> read_ids(const fs::path& file, int width) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), {}};
  std::vector<int64_t> ids;
  for (size_t i = 0; i + width <= bytes.size(); i += width) {
    int64_t id = 0;
    for (int k = 0; k < width; ++k)
      id |= int64_t{static_cast<unsigned char>(bytes[i + k])} << (8 * k);
    ids.push_back(id);
  }
  return ids;
}

// prepare_text --tokenizer: the ids tools/tokenize gives (tokenizers' own, above) and the eos, in
// uint16 files, or uint32 ones for a vocabulary over 65,536 ids; meta.json names the tokenizer.
TEST_F(HfTokenizerTest, PrepareTextWritesTheTokenizersIds) {
  ASSERT_EQ(parity_.code, 0) << parity_.out;
  nlohmann::json big = nlohmann::json::parse(std::ifstream(dir_ / "qwen2/tokenizer.json"));
  big["added_tokens"].push_back({{"id", 70000}, {"content", "<|far|>"}, {"special", true}});
  fs::create_directories(dir_ / "big");
  std::ofstream(dir_ / "big/tokenizer.json") << big.dump();
  const std::string text_file = "tests/fabric/data/hf_tokenizer_parity.py";
  for (const auto& [name, width] : {std::pair<std::string, int>{"llama3", 2}, {"big", 4}}) {
    const fs::path tokenizer = dir_ / name / "tokenizer.json", out = dir_ / ("prepared_" + name);
    const auto r = fabric::testing::run_command(
        fabric::testing::helper_binary("//tools:prepare_text") + " --input=" + text_file +
        " --tokenizer=" + tokenizer.string() + " --output=" + out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    const auto tool =
        fabric::testing::run_command(fabric::testing::helper_binary("//tools:tokenize") +
                                     " --tokenizer=" + tokenizer.string() + " < " + text_file);
    ASSERT_EQ(tool.code, 0) << tool.out;
    std::vector<int64_t> want;
    std::istringstream words(tool.out);
    for (int64_t id; words >> id;) want.push_back(id);
    const fabric::TokenMeta meta = fabric::read_token_meta(out);
    const BpeTokenizer loaded = fabric::load_meta_tokenizer(meta);
    want.push_back(loaded.eot());
    std::vector<int64_t> got = read_ids(out / "train.bin", width);
    const auto val = read_ids(out / "val.bin", width);
    got.insert(got.end(), val.begin(), val.end());
    EXPECT_EQ(got, want) << name;
    EXPECT_EQ(meta.tokenizer, "hf-tokenizer");
    EXPECT_EQ(meta.tokenizer_json, tokenizer);
    EXPECT_EQ(meta.vocab_size, width == 4 ? 70001 : 1202);
    EXPECT_EQ(loaded.encode("Hello world"),
              BpeTokenizer::from_tokenizer_json(tokenizer).encode("Hello world"));
  }
  // A tokenizer.json alone (no eos anywhere): two files' tokens joined without a separator, said.
  fs::create_directories(dir_ / "alone");
  std::ofstream(dir_ / "second.txt") << "a second document, " << std::string(300, 'z');
  {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir_ / "llama3/tokenizer.json"));
    nlohmann::json kept = nlohmann::json::array();
    for (const auto& a : j["added_tokens"])
      if (a["content"] != "<|endoftext|>") kept.push_back(a);
    j["added_tokens"] = kept;
    j["model"]["vocab"].erase("<|endoftext|>");
    std::ofstream(dir_ / "alone/tokenizer.json") << j.dump();
  }
  const auto alone = fabric::testing::run_command(
      fabric::testing::helper_binary("//tools:prepare_text") + " --input=" + text_file +
      " --input=" + (dir_ / "second.txt").string() + " --tokenizer=" +
      (dir_ / "alone/tokenizer.json").string() + " --output=" + (dir_ / "prepared_alone").string());
  EXPECT_EQ(alone.code, 0) << alone.out;
  EXPECT_NE(alone.out.find("warning: --tokenizer: no end-of-text id found"), std::string::npos)
      << alone.out;
  // An added token's id beyond uint32 (it was written as its low 32 bits): refused when the
  // tokenizer is read, as `tokenizers` refuses it.
  big["added_tokens"].push_back(
      {{"id", (int64_t{1} << 32) + 7}, {"content", "<|beyond|>"}, {"special", true}});
  fs::create_directories(dir_ / "beyond");
  std::ofstream(dir_ / "beyond/tokenizer.json") << big.dump();
  const auto beyond = fabric::testing::run_command(
      fabric::testing::helper_binary("//tools:prepare_text") + " --input=" + text_file +
      " --tokenizer=" + (dir_ / "beyond/tokenizer.json").string() +
      " --output=" + (dir_ / "prepared_beyond").string());
  EXPECT_NE(beyond.code, 0) << beyond.out;
  EXPECT_NE(beyond.out.find("] has no \"id\" in [0, 2^32) or no \"content\" string"),
            std::string::npos)
      << beyond.out;
  // Latin-1 text (its 0xE9) was encoded into garbage ids, exit 0: refused naming file and byte.
  std::ofstream(dir_ / "latin1.txt") << "caf\xe9 au lait, " << std::string(200, 'x');
  const auto latin1 =
      fabric::testing::run_command(fabric::testing::helper_binary("//tools:prepare_text") +
                                   " --input=" + (dir_ / "latin1.txt").string() +
                                   " --tokenizer=" + (dir_ / "llama3/tokenizer.json").string() +
                                   " --output=" + (dir_ / "prepared_latin1").string());
  EXPECT_NE(latin1.code, 0) << latin1.out;
  EXPECT_NE(
      latin1.out.find((dir_ / "latin1.txt").string() + ": byte 3 is not UTF-8; give UTF-8 text"),
      std::string::npos)
      << latin1.out;
}

TEST(Utf8, WellFormedOnlyAsUnicodeDefinesIt) {
  EXPECT_EQ(fabric::first_invalid_utf8("plain, \xc3\xa9, \xe2\x82\xac, \xf0\x9f\x98\x80"),
            std::string::npos);
  EXPECT_EQ(fabric::first_invalid_utf8("\xf4\x8f\xbf\xbf"), std::string::npos);  // U+10FFFF
  EXPECT_EQ(fabric::first_invalid_utf8("ab\xed\xa0\x80"), 2u);                   // a surrogate
  EXPECT_EQ(fabric::first_invalid_utf8("\xc0\xaf"), 0u);                         // overlong '/'
  EXPECT_EQ(fabric::first_invalid_utf8("\xe0\x80\xaf"), 0u);                     // overlong
  EXPECT_EQ(fabric::first_invalid_utf8("x\xf4\x90\x80\x80"), 1u);                // above U+10FFFF
  EXPECT_EQ(fabric::first_invalid_utf8("\xf7\xbf\xbf\xbf"), 0u);
  EXPECT_EQ(fabric::first_invalid_utf8("\xe2\x82"), 0u);  // cut short
  EXPECT_EQ(fabric::first_invalid_utf8("\x80"), 0u);      // a lone continuation
}

TEST(HfPatternTest, Llama3AndQwen2Splits) {
  using V = std::vector<std::string>;
  constexpr auto kLlama = BpeTokenizer::Pattern::kLlama3;
  constexpr auto kQwen = BpeTokenizer::Pattern::kQwen2;
  EXPECT_EQ(BpeTokenizer::pretokenize("Hello   world", kLlama), (V{"Hello", "  ", " world"}));
  EXPECT_EQ(BpeTokenizer::pretokenize("DON'T 'Re x", kLlama), (V{"DON", "'T", " '", "Re", " x"}));
  EXPECT_EQ(BpeTokenizer::pretokenize("1234567 (a) ((b", kLlama),
            (V{"123", "456", "7", " (", "a", ")", " ((", "b"}));
  EXPECT_EQ(BpeTokenizer::pretokenize("123 x", kQwen), (V{"1", "2", "3", " x"}));
  EXPECT_EQ(BpeTokenizer::pretokenize("a.\n\n  b\tc \n", kLlama),
            (V{"a", ".\n\n", " ", " b", "\tc", " \n"}));
  EXPECT_EQ(BpeTokenizer::pretokenize("x\t\t(y", kLlama), (V{"x", "\t", "\t", "(y"}));
}

TEST(HfPatternTest, Nfc) {
  EXPECT_EQ(BpeTokenizer::nfc("Cafe\u0301 A\u030a"), "Caf\u00e9 \u00c5");
  EXPECT_EQ(BpeTokenizer::nfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul
  EXPECT_EQ(BpeTokenizer::nfc("a\u0323\u0302"), "\u1ead");       // reordered marks
  EXPECT_EQ(BpeTokenizer::nfc("a\u0302\u0323"), "\u1ead");
  EXPECT_EQ(BpeTokenizer::nfc("\u212b plain ascii"), "\u00c5 plain ascii");  // singleton
}

}  // namespace
