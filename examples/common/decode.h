// Which decode examples:generate and examples:finetune's sample answer use under the run's
// strategy, and generation without a key/value cache through Fabric for where the cached one
// cannot run (sequence, context or pipeline parallelism): every step the model's forward over the
// whole sequence via Fabric::forward (any strategy: every rank runs the same steps on the same
// ids), the next id chosen as fabric::models::choose_next_tokens does (greedy at temperature 0:
// the first of equal logits).
#ifndef EXAMPLES_COMMON_DECODE_H_
#define EXAMPLES_COMMON_DECODE_H_

#include <torch/utils.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/models/generate.h"

namespace examples {

// True when fabric::models::generate (the key/value cache; it calls the model's layers directly)
// runs under the run's strategy: single_device, ddp, fsdp (each operator gathers the fsdp units
// it reads, as in the forward) and model_parallel with tensor parallelism alone (each rank caches
// its heads; the row layers and the output sum or gather the ranks' parts). Not under sequence,
// context or pipeline parallelism: a step of one position cannot be cut over ranks, and a
// pipeline stage holds only its layers.
inline bool cached_decode_runs(fabric::Fabric& f) {
  const std::string strategy = f.strategy().name();
  if (strategy == "single_device" || strategy == "ddp" || strategy == "fsdp") return true;
  if (strategy != "model_parallel") return false;
  const fabric::Config& c = f.config();
  return !c.get_bool("fabric.model_parallel.sequence_parallel") &&
         c.get_int("fabric.model_parallel.context_parallel_size") == 1 &&
         c.get_int("fabric.model_parallel.pipeline_parallel_size") == 1;
}

// Up to o.max_new_tokens ids after `ids` (stopping after an id of o.eos_token_ids or at
// `positions`), in eval mode without gradients (the module's mode restored): the new ids.
template <typename Holder>
std::vector<int64_t> generate_uncached(fabric::Fabric& f, Holder& model, std::vector<int64_t> ids,
                                       int64_t positions,
                                       const fabric::models::GenerateOptions& o) {
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  at::Generator gen = at::detail::createCPUGenerator(o.seed);
  const size_t prompt = ids.size();
  for (int64_t i = 0; i < o.max_new_tokens && static_cast<int64_t>(ids.size()) < positions; ++i) {
    const torch::Tensor x = torch::tensor(ids).view({1, -1}).to(f.device());
    torch::Tensor logits;
    {
      auto guard = f.autocast();
      logits = f.forward(model, x);
    }
    const int64_t next = fabric::models::choose_next_tokens(
                             logits.select(1, -1).to(torch::kCPU, torch::kFloat), o, gen)[0]
                             .item<int64_t>();
    ids.push_back(next);
    if (std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), next) != o.eos_token_ids.end())
      break;
  }
  if (was_training) model->train();
  return std::vector<int64_t>(ids.begin() + static_cast<std::ptrdiff_t>(prompt), ids.end());
}

}  // namespace examples

#endif  // EXAMPLES_COMMON_DECODE_H_
