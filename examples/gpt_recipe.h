// The GPT recipe's configuration (examples/gpt.cc; tools/estimate_memory builds its model from
// the same keys): the schema (training_schema() plus model.*, gpt.*, data.token_dtype) and the
// GPTConfig the model.* keys select.
#ifndef EXAMPLES_GPT_RECIPE_H_
#define EXAMPLES_GPT_RECIPE_H_

#include <cstdint>

#include "fabric/config/config.h"
#include "fabric/config/schema.h"
#include "fabric/models/gpt.h"

namespace examples::gpt {

fabric::ConfigSchema schema();
// model.preset with the model.* fields that are > 0 replacing the preset's; `meta_vocab` (> 0):
// the data's vocabulary (padded up to a multiple of 64), unless model.vocab_size is set.
fabric::models::GPTConfig model_config(const fabric::Config& c, int64_t meta_vocab);

}  // namespace examples::gpt

#endif  // EXAMPLES_GPT_RECIPE_H_
