// fabric::BpeTokenizer: GPT-2's byte-level BPE tokenizer, from the vocabulary files of GPT-2 (or
// of any tokenizer trained the same way): vocab.json + merges.txt as Hugging Face ships them,
// which are OpenAI's encoder.json + vocab.bpe under other names. Nothing is downloaded.
//
// Encoding as GPT-2's encoder.py does it: the text is split into pieces by GPT-2's pattern
// ('s 't 're 've 'm 'll 'd, an optional space followed by letters, by digits or by other symbols,
// runs of whitespace), each piece's UTF-8 bytes are mapped to GPT-2's printable stand-ins
// (bytes_to_unicode) and merged pair by pair, lowest merge rank first, and the merged symbols are
// looked up in the vocabulary. Letters and numbers are Unicode's \p{L} and \p{N} (general
// categories L* and N* of Unicode 14, tools/gen_unicode_classes.py). With GPT-2's own files the
// ids equal tiktoken's "gpt2" encoding (docs/data.md gives the check and its result).
// Special tokens ("<|endoftext|>") are never produced from text; eot() gives its id.
//
//   auto bpe = fabric::BpeTokenizer::load("gpt2/vocab.json", "gpt2/merges.txt");
//   std::vector<int64_t> ids = bpe.encode("Hello world");   // {15496, 995} with GPT-2's files
//   std::string text = bpe.decode(ids);
//
// Or from a Hugging Face tokenizer.json of a byte-level BPE (GPT-2's, Llama 3's and Qwen2's kind),
// run as Hugging Face `tokenizers` runs it: its added and special tokens are cut out of the text
// first (lstrip, rstrip, single_word, normalized as the file says), the rest is normalized (none,
// or NFC), split by the file's pre-tokenizer pattern (GPT-2's, Llama 3's or Qwen2's; the three are
// hand-written scanners over Unicode classes, not a regex engine) and merged as above, with
// `ignore_merges` (Llama 3: a piece that is a whole vocabulary entry is that entry). Merges may be
// "a b" strings or ["a", "b"] pairs. bos/eos come from tokenizer_config.json and
// generation_config.json beside the file when they exist. Unigram, WordPiece, WordLevel models,
// other normalizers and other patterns are a one-line fabric::Error naming the file.
//
//   auto tok = fabric::BpeTokenizer::from_tokenizer_json("llama3/tokenizer.json");
#ifndef FABRIC_DATA_BPE_H_
#define FABRIC_DATA_BPE_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fabric/core/utf8.h"

namespace fabric {

class BpeTokenizer {
 public:
  // Throws fabric::Error naming the file and line for a file that cannot be read or parsed, a
  // merge whose result is not in the vocabulary, a vocabulary without the 256 byte symbols, or
  // one whose ids are negative or shared by two symbols.
  static BpeTokenizer load(const std::filesystem::path& vocab_json,
                           const std::filesystem::path& merges_txt);

  // Throws fabric::Error (one line naming the file) for a file that cannot be read or parsed and
  // for a tokenizer this class does not run (the message says what is not supported).
  static BpeTokenizer from_tokenizer_json(const std::filesystem::path& tokenizer_json);

  std::vector<int64_t> encode(const std::string& text) const;
  // The bytes of `ids` (special tokens as their text); throws fabric::Error for an unknown id.
  std::string decode(const std::vector<int64_t>& ids) const;
  // What `tokenizers`' decode(ids, skip_special_tokens=False) returns: ids outside the vocabulary
  // skipped (a model's vocabulary padded past the tokenizer's) and the bytes made valid UTF-8
  // (each ill-formed sequence one U+FFFD). For text shown to people or written to JSON.
  std::string decode_text(const std::vector<int64_t>& ids) const;
  // Size of the id space: the largest id + 1.
  int64_t vocab_size() const { return vocab_size_; }
  // Id of "<|endoftext|>", or -1 when the vocabulary has none.
  // From tokenizer.json: the eos token's id (tokenizer_config.json, else generation_config.json),
  // else "<|endoftext|>"'s.
  int64_t eot() const { return eot_; }
  // The bos token's id (tokenizer_config.json, else generation_config.json), or -1.
  int64_t bos() const { return bos_; }

  // The pre-tokenizer patterns: GPT-2's, Llama 3's (digits in threes, case-insensitive
  // contractions, a symbol or space joined to the word after it) and Qwen2's (Llama 3's, digits
  // one by one).
  enum class Pattern { kGpt2, kLlama3, kQwen2 };
  // The pieces `pattern` splits `text` into (exposed for tests).
  static std::vector<std::string> pretokenize(const std::string& text,
                                              Pattern pattern = Pattern::kGpt2);
  // Unicode's NFC of UTF-8 `text` (exposed for tests).
  static std::string nfc(const std::string& text);

 private:
  std::unordered_map<std::string, int64_t> vocab_;    // symbol (stand-in UTF-8) → id
  std::unordered_map<int64_t, std::string> symbols_;  // id → symbol
  std::map<std::pair<std::string, std::string>, int> ranks_;
  std::vector<std::string> byte_symbol_;  // byte → stand-in UTF-8
  std::unordered_map<std::string, unsigned char> symbol_byte_;
  int64_t vocab_size_ = 0, eot_ = -1, bos_ = -1;
  // tokenizer.json's settings.
  struct AddedToken {
    std::string content;
    int64_t id;
    bool lstrip, rstrip, single_word, normalized;
  };
  std::vector<AddedToken> added_;
  std::unordered_map<int64_t, std::string> added_text_;  // id → content, for decode
  std::vector<std::vector<size_t>> added_by_byte_;       // first byte → indices into added_
  Pattern pattern_ = Pattern::kGpt2;
  bool nfc_ = false, ignore_merges_ = false, add_prefix_space_ = false, prefix_pieces_ = false;
  struct Loader;  // bpe.cc: the vocabulary and merges of both file kinds
  void encode_text(const std::string& text, std::vector<int64_t>& ids) const;
  void encode_piece(const std::string& piece, std::vector<int64_t>& ids) const;
  mutable std::shared_ptr<std::unordered_map<std::string, std::vector<int64_t>>> cache_;
};

// GPT-2's bytes_to_unicode: the UTF-8 stand-in of each byte 0..255 in a byte-level vocabulary
// (printable Latin-1 bytes stand for themselves, the other 68 for code points 256, 257, ...).
std::vector<std::string> byte_level_symbols();

// What a text file must be before a tokenizer.json encodes it (Python's `tokenizers` takes str):
// well-formed UTF-8, fabric::first_invalid_utf8 (fabric/core/utf8.h) npos.

}  // namespace fabric

#endif  // FABRIC_DATA_BPE_H_
