// Text generation with a key/value cache, for any decoder that attends over its earlier positions
// (the Llama family: fabric/models/llama_generate.h; GPT-2: fabric/models/gpt_generate.h): the
// prompts run through the model once (prefill), then one token per step, each step attending to
// the cached keys and values of every earlier position. Greedy (temperature 0) or sampled
// (temperature, top-k, top-p); a row stops at an end-of-sequence id.
//
// A batch of prompts of different lengths runs as one batch, left-padded: an attention mask keeps
// every row from attending to its padding, and each row's positions count from its first real
// token (0, 1, ...), so a row generates what it would alone (as transformers' generate with left
// padding and attention_mask). The models' forward (the training path) is not used or changed.
//
// This header holds what the models share: the options, the output, the choice of the next token
// and the decode loop (fabric::models::decode), which a model drives through a Decoder.
#ifndef FABRIC_MODELS_GENERATE_H_
#define FABRIC_MODELS_GENERATE_H_

#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

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

// One next-token choice from logits [B, V] under o (greedy, or sampled with `generator`):
// int64 [B] on the CPU.
torch::Tensor choose_next_tokens(const torch::Tensor& logits, const GenerateOptions& o,
                                 at::Generator& generator);

namespace decode {

// One layer's cached keys and values, [B, kv_heads, capacity, D] each.
struct LayerCache {
  torch::Tensor k, v;
};

// One forward of the new positions of every row: tokens [B, T] (on the model's device) at
// positions [B, T] (int64: each row's count from its first real token), the first `cached`
// positions of every row already in the caches.
struct Step {
  torch::Tensor tokens, positions;
  int64_t cached = 0;
  torch::Tensor mask;     // [B, 1, T, S] (S = cached + T), true where query t may read key s
  torch::Tensor blocked;  // T == 1: the mask's negation, [B, 1, 1, S]; else undefined

  // Writes this step's keys and values k, v [B, kv_heads, T, D] into `cache` at positions cached
  // … cached + T, and returns the attention of q [B, heads, T, D] over the cache's first S
  // positions under the mask, [B, heads, T, D] in q's dtype (query head h reads key/value head
  // h / (heads / kv_heads), as transformers' repeat_kv).
  torch::Tensor attend(LayerCache& cache, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v) const;
};

// What the loop needs of a model.
struct Decoder {
  int64_t layers = 0, kv_heads = 0, head_dim = 0, vocab_size = 0;
  int64_t max_positions = 0;     // prompt + new ids may not exceed it
  std::string positions_key;     // names max_positions in errors (config.json's key)
  int64_t sliding_window = 0;    // > 0: prompt + new ids may not exceed it either
  torch::TensorOptions options;  // the cache's dtype and device (the model's)
  // The logits of every row's last new position, float [B, V], with this step's keys and values
  // written to caches[layer] (Step::attend).
  std::function<torch::Tensor(const Step&, std::vector<LayerCache>&)> forward;
};

// fabric::Error for a model the decode steps cannot run on: under sequence parallelism (a step of
// one position cannot be cut over the tensor-parallel ranks) or context parallelism.
void check_parallelism(bool sequence_parallel, bool context_parallel);

// The generation loop: validates the prompts and options (fabric::Error naming the prompt, the
// option or the limit), allocates the caches, runs the prefill and the decode steps and times
// them, with `model` (the one d.forward runs) in eval mode without gradients; its mode is
// restored afterwards, also on an error.
GenerateOutput generate(torch::nn::Module& model, const Decoder& d,
                        const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o);

}  // namespace decode

}  // namespace fabric::models

#endif  // FABRIC_MODELS_GENERATE_H_
