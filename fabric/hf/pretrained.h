// A Hugging Face model folder as a program that trains or runs "any of them" sees it
// (model.pretrained in examples/gpt.cc and examples/generate.cc): which architecture config.json
// names, its configuration, the generation defaults, and the weights by the model's own
// parameter names, memory-mapped.
//
//   fabric::hf::Pretrained p = fabric::hf::read_pretrained("Qwen2.5-0.5B");
//   if (p.llama) { fabric::models::Llama model(*p.llama); ... }
//   f.load_weights(model, fabric::hf::model_weights(p).tensors, p.folder.string());
#ifndef FABRIC_HF_PRETRAINED_H_
#define FABRIC_HF_PRETRAINED_H_

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "fabric/hf/weights.h"
#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"

namespace fabric::hf {

struct Pretrained {
  std::filesystem::path folder;
  std::string model_type;                            // config.json's: llama, qwen2, mistral or gpt2
  std::optional<fabric::models::LlamaConfig> llama;  // llama, qwen2, mistral
  std::optional<fabric::models::GPTConfig> gpt2;     // gpt2
  // generation_config.json (else config.json): the ids that end a generation (eos_token_id, one
  // or a list), bos_token_id and pad_token_id (-1: none).
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1, pad_token_id = -1;
  // The bos id goes first: tokenizer_config.json's add_bos_token when it has one, else whether
  // tokenizer.json's post-processor (TemplateProcessing) starts a sequence with a special token
  // (Llama 3's way; then bos_token_id is that token's id), else false.
  bool add_bos_token = false;

  int64_t vocab_size() const;
  int64_t max_positions() const;  // max_position_embeddings / n_positions
  int64_t parameters() const;
  // "qwen2 (Llama family): 24 layers, 14 heads (2 key/value), width 896, 32768 positions,
  // vocabulary 151936, tied output"
  std::string describe() const;
};

// DIR/config.json read as its model_type says. fabric::Error, one line naming the path, for: a
// path that does not exist; a Fabric++ checkpoint (a .ckpt file or a sharded checkpoint folder:
// the error names the key that loads it, checkpoint.resume or model.init_weights); a folder
// without config.json; a model_type other than llama, qwen2, mistral, gpt2; whatever
// read_llama_config / read_gpt2_config refuse; and config.json's layer count or token embedding
// disagreeing with the weights' (check_llama_sizes / check_gpt2_sizes, when the weights can be
// read; else model_weights says why), before anything of config.json's sizes is built.
Pretrained read_pretrained(const std::filesystem::path& folder);

// fabric::Error when the folder's tokenizer (its vocabulary size: tokenizer.json's ids) makes
// ids the model has no row for (config.json's vocab_size is smaller); naming both files.
void check_tokenizer_fits(const Pretrained& p, int64_t tokenizer_vocab_size);

// The folder's weights named as the model names its parameters (views of the memory-mapped
// files; each still knows its file for errors): Llama-family names as they are (rotary inv_freq
// buffers dropped, and lm_head.weight when tied); GPT-2's renamed and transposed
// (fabric/hf/gpt2.h).
Weights model_weights(const Pretrained& p);

}  // namespace fabric::hf

#endif  // FABRIC_HF_PRETRAINED_H_
