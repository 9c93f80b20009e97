// The GPT example's text (examples/gpt.cc): where its tokens come from (data.root, or the default
// corpus of this machine's Python sources, prepared on first use), what data.root/meta.json says,
// and the sample generated at the end of a run.
#ifndef EXAMPLES_GPT_TEXT_H_
#define EXAMPLES_GPT_TEXT_H_

#include <filesystem>
#include <string>

#include "fabric/fabric.h"
#include "fabric/models/gpt.h"

namespace examples::gpt {

// data.root/meta.json as tools/prepare_text writes it (absent: all empty).
struct Meta {
  int64_t vocab_size = 0;
  std::string tokenizer;      // "bytes", "gpt2-bpe" or ""
  std::string vocab, merges;  // gpt2-bpe: the tokenizer's files
};

// data.root, or the default corpus (prepared by each node's local rank 0 on first use).
std::filesystem::path data_root(fabric::Fabric& f);

// The meta.json in `root`; fabric::Error naming it when it is not JSON.
Meta read_meta(const std::filesystem::path& root);

// gpt.sample_tokens tokens after gpt.prompt (top-k, temperature; the same on every rank),
// decoded by meta.json's tokenizer.
std::string sample(fabric::Fabric& f, fabric::models::GPT& model, const Meta& meta);

}  // namespace examples::gpt

#endif  // EXAMPLES_GPT_TEXT_H_
