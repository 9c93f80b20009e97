// The GPT example's text (examples/gpt.cc): where its tokens come from (data.root, or the default
// corpus of this machine's Python sources, prepared on first use), what data.root/meta.json says,
// and the sample generated at the end of a run.
#ifndef EXAMPLES_GPT_TEXT_H_
#define EXAMPLES_GPT_TEXT_H_

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fabric/data/bpe.h"
#include "fabric/data/tokens.h"
#include "fabric/fabric.h"
#include "fabric/hf/pretrained.h"

namespace examples::gpt {

// data.root/meta.json as tools/prepare_text writes it (fabric::TokenMeta; absent: all empty), and
// the sample's tokenizer and prompt, found before training (check_prompt).
struct Meta : fabric::TokenMeta {
  std::shared_ptr<const fabric::BpeTokenizer> bpe;  // gpt2-bpe
  std::vector<int64_t> prompt;                      // gpt.prompt's ids
  std::string no_sample;                            // why there is none, or ""
};

// data.root, or the default corpus (prepared by each node's local rank 0 on first use).
std::filesystem::path data_root(fabric::Fabric& f);

// Where the examples keep what they prepare once (corpora, demos, token caches):
// $XDG_CACHE_HOME/fabricpp, else ~/.cache/fabricpp.
std::filesystem::path cache_home();

// The folder of this machine's Python standard library (python3 asked), or "" without Python.
std::string python_stdlib();

// The meta.json in `root` (fabric::read_token_meta: fabric::Error naming the file, the field and
// the fix for a bad one).
Meta read_meta(const std::filesystem::path& root);

// With gpt.sample_tokens > 0: loads meta.json's tokenizer and encodes gpt.prompt into
// meta.prompt, its ids checked against meta.json's vocab_size and the model's `model_vocab`
// (fabric::encode_checked), so that a bad prompt or tokenizer stops the run before training.
void check_prompt(const fabric::Config& c, Meta& meta, int64_t model_vocab);

// gpt.sample_tokens tokens after meta.prompt (top-k, temperature; the same on every rank; a
// token of `eos` ends it), each from the last position of logits_of(ids [1, T]) with T at most
// `positions`, decoded by meta.json's tokenizer. `model` is put in eval mode meanwhile.
std::string sample(fabric::Fabric& f, torch::nn::Module& model,
                   const std::function<torch::Tensor(const torch::Tensor&)>& logits_of,
                   int64_t positions, const Meta& meta, const std::vector<int64_t>& eos);

// With model.pretrained: prints a warning when data.root's tokens were not made by the folder's
// tokenizer.json (meta.json names another tokenizer or another file with other contents).
void check_tokenizer(fabric::Fabric& f, const fabric::hf::Pretrained& p, const Meta& meta);

}  // namespace examples::gpt

#endif  // EXAMPLES_GPT_TEXT_H_
