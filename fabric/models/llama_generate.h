// Text generation for fabric::models::Llama with a key/value cache: the prompts run through the
// model once (prefill), then one token per step, each step attending to the cached keys and values
// of every earlier position. Greedy (temperature 0) or sampled (temperature, top-k, top-p); a row
// stops at an end-of-sequence id.
//
// A batch of prompts of different lengths runs as one batch, left-padded: an attention mask keeps
// every row from attending to its padding, and each row's rotary positions count from its first
// real token (0, 1, ...), so a row generates what it would alone (as transformers' generate with
// left padding and attention_mask). The model's forward (the training path) is not used or changed.
//
//   fabric::models::GenerateOptions o;
//   o.max_new_tokens = 32;  // temperature 0: greedy
//   auto out = fabric::models::generate(*model, {{1, 5, 9}, {7, 3}}, o);
//   out.tokens[0];          // row 0's new ids (ending with the eos id if it stopped there)
#ifndef FABRIC_MODELS_LLAMA_GENERATE_H_
#define FABRIC_MODELS_LLAMA_GENERATE_H_

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "fabric/models/llama.h"

namespace fabric::models {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy (argmax); otherwise logits / temperature are sampled
  int64_t top_k = 0;         // sampling: only the k likeliest tokens (0: all)
  double top_p = 1.0;        // sampling: the smallest set of likeliest tokens holding p (1: all)
  std::vector<int64_t> eos_token_ids;  // a row stops after emitting one of these (none: never)
  int64_t pad_token_id = 0;  // GenerateOutput::ids after a row stopped (any value, -1 too)
  uint64_t seed = 0;         // sampling's generator (CPU), when `generator` is unset
  std::optional<at::Generator> generator;
  // Called after each decode step with the number of new ids so far (2, 3, ...; not after the
  // prefill), e.g. to step a profiler (examples/generate: profiler.*).
  std::function<void(int64_t)> on_step;
};

struct GenerateOutput {
  // Each row's new ids, ending with the eos id where the row stopped at one.
  std::vector<std::vector<int64_t>> tokens;
  // The same as int64 [B, steps] (steps <= max_new_tokens: fewer when every row stopped early),
  // pad_token_id after a row's eos.
  torch::Tensor ids;
  int64_t steps = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;            // the steps after the first token
  double decode_tokens_per_second = 0;  // rows × (steps − 1) / decode_seconds
};

// Generates up to o.max_new_tokens after each prompt (token ids; none empty; each prompt's length
// plus max_new_tokens at most max_position_embeddings, and at most the sliding window if one is
// set) on the model's device, in eval mode and without gradients. fabric::Error for empty or
// too-long prompts, ids outside the vocabulary, a tensor-parallel model, bad options.
GenerateOutput generate(LlamaImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o = {});

// One next-token choice from logits [B, V] under o (greedy, or sampled with `generator`):
// int64 [B] on the CPU.
torch::Tensor choose_next_tokens(const torch::Tensor& logits, const GenerateOptions& o,
                                 at::Generator& generator);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_LLAMA_GENERATE_H_
