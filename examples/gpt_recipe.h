// The GPT recipe's configuration (examples/gpt.cc; tools/estimate_memory builds its model from
// the same keys): the schema (training_schema() plus model.*, gpt.*, data.token_dtype) and the
// GPTConfig the model.* keys select.
#ifndef EXAMPLES_GPT_RECIPE_H_
#define EXAMPLES_GPT_RECIPE_H_

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "fabric/checkpoint/state_dict.h"
#include "fabric/config/config.h"
#include "fabric/config/schema.h"
#include "fabric/hf/pretrained.h"
#include "fabric/models/gpt.h"

namespace examples::gpt {

fabric::ConfigSchema schema();
// model.preset with the model.* fields that are > 0 replacing the preset's; `meta_vocab` (> 0):
// the data's vocabulary (padded up to a multiple of 64), unless model.vocab_size is set.
fabric::models::GPTConfig model_config(const fabric::Config& c, int64_t meta_vocab);

// The model a run trains: the GPT of model.preset and the model.* fields, or, with
// model.pretrained, the architecture of that Hugging Face folder's config.json (Llama, Qwen2,
// Mistral or GPT-2; fabric/hf/pretrained.h).
struct ModelChoice {
  std::optional<fabric::hf::Pretrained> pretrained;
  fabric::models::GPTConfig gpt;  // the GPT's (model.*, or GPT-2's from config.json)
  int64_t window = 0;             // tokens per training sequence (model.block_size)

  bool is_llama() const { return pretrained && pretrained->llama.has_value(); }
  int64_t vocab_size() const;
  int64_t positions() const;  // the longest sequence the model takes
  int64_t parameters() const;
  // Training FLOPs per token at `window` (GPTConfig / LlamaConfig::flops_per_token).
  double flops_per_token() const;
  std::string describe(const fabric::Config& c) const;  // for the run's first line
};

// checkpoint.export_format: hf: `whole` (the model's state by its names) as a Hugging Face folder
// (fabric/hf/export.h): the Llama family as its model_type, a GPT as GPT-2; with model.pretrained
// the folder's tokenizer files and generation_config.json copied beside it, and its bos/eos ids.
void export_hf(const fabric::Config& c, const ModelChoice& m, const fabric::StateDict& whole,
               const std::filesystem::path& folder);

// model_config, or with model.pretrained: the folder read (fabric::hf::read_pretrained's errors
// as ConfigErrors at model.pretrained), the model.* size keys refused when given too (naming both),
// model.block_size at most the model's positions (0: the smaller of them and 1024), and
// `meta_vocab` (the data's vocabulary, when > 0) at most the model's.
ModelChoice choose_model(const fabric::Config& c, int64_t meta_vocab);

}  // namespace examples::gpt

#endif  // EXAMPLES_GPT_RECIPE_H_
