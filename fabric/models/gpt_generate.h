// Text generation for fabric::models::GPT (GPT-2) with a key/value cache (fabric/models/generate.h:
// the options, the batching of prompts of different lengths, the decode loop). Each row's learned
// positions count from its first real token, as transformers' generate with left padding and
// attention_mask. The model's forward (the training path) is not used or changed.
//
//   fabric::models::GPT model = fabric::hf::load_gpt2(dir);
//   fabric::models::GenerateOptions o;
//   o.max_new_tokens = 32;  // temperature 0: greedy
//   auto out = fabric::models::generate(*model, {{464, 2068}, {40}}, o);
#ifndef FABRIC_MODELS_GPT_GENERATE_H_
#define FABRIC_MODELS_GPT_GENERATE_H_

#include <cstdint>
#include <vector>

#include "fabric/models/generate.h"
#include "fabric/models/gpt.h"

namespace fabric::models {

// Generates up to o.max_new_tokens after each prompt (token ids; none empty; each prompt's length
// plus max_new_tokens at most block_size, config.json's n_positions) on the model's device, in
// eval mode and without gradients. fabric::Error for empty or too-long prompts, ids outside the
// vocabulary, a model under sequence or context parallelism, bad options. Under tensor
// parallelism each rank caches its heads (call it on every rank of the group with the same
// prompts and options: the output layer gathers).
GenerateOutput generate(GPTImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o = {});

}  // namespace fabric::models

#endif  // FABRIC_MODELS_GPT_GENERATE_H_
