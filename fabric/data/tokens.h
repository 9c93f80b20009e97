// Token files in nanoGPT's format, for language models: a flat array of little-endian uint16 (or
// uint32, for vocabularies over 65,535) token ids, e.g. DIR/train.bin and DIR/val.bin as
// nanoGPT's prepare scripts and tools/prepare_text write them. The file is memory-mapped: opening a
// 20 GB corpus costs nothing until its windows are read.
//
// Example i is the window of block_size + 1 tokens starting at token i * block_size: data is its
// first block_size tokens, target the same shifted by one (the next token at each position), both
// int64 [block_size]. The windows tile the file (the last token of one is the first of the next),
// so an epoch reads every token once; the DataLoader's sampler shuffles and shares them between
// ranks and resumes mid-epoch exactly, as for any dataset.
//
// Opening checks the whole file, each problem one line naming the file and the fix: a size that is
// not a whole number of tokens, a file shorter than one window, a token id at or above
// `vocab_size` (with its token offset; an id over 65,535 under a smaller vocabulary is named as
// uint16 ids read as uint32), uint16 ids of which every second one is 0 (uint32 ids read as
// uint16). open_token_splits (below) checks a folder's files against its meta.json.
//
//   auto train = fabric::TokenDataset::open("data/train.bin", {.block_size = 256});
#ifndef FABRIC_DATA_TOKENS_H_
#define FABRIC_DATA_TOKENS_H_

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fabric/data/bpe.h"
#include "fabric/data/dataset.h"

namespace fabric {

class TokenDataset : public Dataset {
 public:
  struct Options {
    int64_t block_size = 256;  // tokens a model sees per example
    int token_bytes = 2;       // 2: uint16 ids; 4: uint32
    int64_t vocab_size = 0;    // > 0: every id must be below it (checked when the file opens)
    // What vocab_size is and the fix, for the error on an id at or above it (defaults: the
    // model's, "prepare the data with this model's tokenizer, or raise model.vocab_size").
    std::string vocab_name = "model.vocab_size";
    std::string vocab_fix = "";
  };
  // Throws fabric::Error "PATH: ..." for a file that cannot be read or fails a check above.
  static std::shared_ptr<TokenDataset> open(const std::string& path, const Options& options);
  ~TokenDataset() override;

  int64_t size() const override { return windows_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  bool cheap_batches() const override { return true; }
  int64_t tokens() const { return tokens_; }
  int64_t block_size() const { return block_; }

 private:
  TokenDataset() = default;
  int64_t token(int64_t i) const;  // the id at token offset i
  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
  int token_bytes_ = 2;
  int64_t tokens_ = 0, block_ = 0, windows_ = 0;
};

// Token ids of `bytes` under the byte-level tokenizer (vocabulary 256: each byte is its own id),
// what tools/prepare_text writes without a BPE vocabulary.
std::vector<uint16_t> byte_tokens(const std::string& bytes);

// What tools/prepare_text does: the text of `inputs` (files; a folder contributes every regular
// file under it, in path order, joined as they are) under the byte-level tokenizer, the last
// `val_fraction` of the tokens written to OUTPUT/val.bin and the rest to OUTPUT/train.bin (uint16),
// and OUTPUT/meta.json ({"tokenizer": "bytes", "vocab_size": 256, "train_tokens": N,
// "val_tokens": M}); each file is written whole or not at all. `accept(path)`, when given, picks
// the files taken from folders. Throws fabric::Error naming the path for an input that cannot be
// read, too little text for two splits, or an output that cannot be written.
struct PreparedText {
  int64_t files = 0, train_tokens = 0, val_tokens = 0;
  // A BPE without an end-of-text id: its files' tokens were joined without a separator.
  bool no_separator = false;
};
PreparedText prepare_byte_text(
    const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& output,
    double val_fraction = 0.1,
    const std::function<bool(const std::filesystem::path&)>& accept = nullptr);

// The same with GPT-2's byte-level BPE (fabric/data/bpe.h) instead of bytes: each file's text
// encoded on its own and followed by the vocabulary's "<|endoftext|>" when it has one (as
// nanoGPT's prepare scripts separate documents); meta.json says {"tokenizer": "gpt2-bpe",
// "vocab_size": V, "vocab": PATH, "merges": PATH, ...} with the absolute paths of the two files.
// A vocabulary over 65,536 ids is refused (uint16 files only).
PreparedText prepare_bpe_text(
    const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& output,
    const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt,
    double val_fraction = 0.1,
    const std::function<bool(const std::filesystem::path&)>& accept = nullptr);

// The same with a Hugging Face tokenizer.json (BpeTokenizer::from_tokenizer_json): each file
// followed by the tokenizer's eos (else "<|endoftext|>") when it has one; meta.json says
// {"tokenizer": "hf-tokenizer", "vocab_size": V, "tokenizer_json": PATH, ...}. A vocabulary over
// 65,536 ids (Llama 3's, Qwen2's) is written as uint32 ids, and meta.json adds "token_dtype":
// "uint32" (read them with data.token_dtype=uint32).
PreparedText prepare_hf_text(
    const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& output,
    const std::filesystem::path& tokenizer_json, double val_fraction = 0.1,
    const std::function<bool(const std::filesystem::path&)>& accept = nullptr);

// DIR/meta.json, what describes a folder of token files (tools/prepare_text writes it beside
// train.bin and val.bin), and the one place token data is checked against it (token_meta.cc): its
// fields' types and signs, its token counts against the files' sizes (a factor of two: the other
// token width), its vocab_size against every id in the files, its tokenizer's vocabulary against
// vocab_size and a prompt's ids against both vocabularies. Each problem is one fabric::Error line
// naming the file, the field and the fix.
//
//   const fabric::TokenMeta meta = fabric::read_token_meta(dir);
//   const auto splits = fabric::open_token_splits(dir, meta, {.block_size = 256, .vocab_size = v});
//
// meta.json's fields (all optional; an absent file gives all of them absent):
//   "tokenizer": "bytes" | "gpt2-bpe" | "hf-tokenizer" | another string (then no tokenizer is
//                known)
//   "vocab_size": the tokenizer's id space (its largest id + 1; unpadded), a whole number >= 1
//   "train_tokens", "val_tokens": the token counts of train.bin and val.bin, whole numbers >= 0
//   "vocab", "merges": gpt2-bpe's vocab.json and merges.txt (both required for gpt2-bpe; a
//                      relative path is taken from meta.json's folder)
//   "tokenizer_json": hf-tokenizer's tokenizer.json (required for hf-tokenizer; relative as above)
struct TokenMeta {
  std::filesystem::path path;  // the meta.json read; empty when there was none
  std::string tokenizer;
  int64_t vocab_size = 0;                      // 0: not given
  int64_t train_tokens = -1, val_tokens = -1;  // -1: not given
  std::filesystem::path vocab, merges;
  std::filesystem::path tokenizer_json;
};

// `text` as the meta.json at `path`. Throws fabric::Error "PATH: ..." for text that is not a JSON
// object and for a field of the wrong type or sign (a string "256", 300.5, -5), or gpt2-bpe
// without its two files.
TokenMeta parse_token_meta(const std::string& text, const std::filesystem::path& path);
// DIR/meta.json (parse_token_meta), or an empty TokenMeta when DIR has none.
TokenMeta read_token_meta(const std::filesystem::path& dir);

struct TokenSplits {
  std::shared_ptr<TokenDataset> train, val;
};
// DIR/train.bin and DIR/val.bin opened with `options` after checking them against `meta`: a
// file whose size is not its train_tokens/val_tokens of options.token_bytes each (when it is that
// count in the other width, the error names data.token_dtype's value to set); every id below
// meta's vocab_size as well as below options.vocab_size (the smaller one is named).
TokenSplits open_token_splits(const std::filesystem::path& dir, const TokenMeta& meta,
                              TokenDataset::Options options);

// meta's gpt2-bpe tokenizer, loaded from its vocab and merges files (hf-tokenizer: its
// tokenizer.json): a file that cannot be read
// names meta.json's field; a vocabulary whose size is not meta's vocab_size is refused.
BpeTokenizer load_meta_tokenizer(const TokenMeta& meta);

// `text`'s ids under meta's tokenizer (bytes: each byte; gpt2-bpe, hf-tokenizer: `bpe`, which
// must be given),
// each checked below meta's vocab_size and `model_vocab` (> 0): fabric::Error "KEY: ..." naming
// the character and the fix. `key` is the config key `text` came from (e.g. gpt.prompt).
std::vector<int64_t> encode_checked(const TokenMeta& meta, const BpeTokenizer* bpe,
                                    const std::string& text, int64_t model_vocab,
                                    const std::string& key);

}  // namespace fabric

#endif  // FABRIC_DATA_TOKENS_H_
