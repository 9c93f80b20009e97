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
// `vocab_size` (with its token offset).
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

#include "fabric/data/dataset.h"

namespace fabric {

class TokenDataset : public Dataset {
 public:
  struct Options {
    int64_t block_size = 256;  // tokens a model sees per example
    int token_bytes = 2;       // 2: uint16 ids; 4: uint32
    int64_t vocab_size = 0;    // > 0: every id must be below it (checked when the file opens)
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

}  // namespace fabric

#endif  // FABRIC_DATA_TOKENS_H_
