#include "fabric/models/gpt_pipeline.h"

#include <memory>
#include <string>

#include "fabric/core/error.h"
#include "fabric/distributed/pipeline_schedule.h"

namespace fabric::models {

GPTStagesImpl::GPTStagesImpl(const GPT& whole, const std::vector<int64_t>& stages,
                             int64_t stage_count)
    : config_(whole->config()), stage_count_(stage_count) {
  const auto split =
      fabric::distributed::split_stage_units(config_.n_layer, stage_count, "model.n_layer");
  const auto& shard =
      whole->blocks.empty() ? whole->wte->parallel() : whole->blocks[0]->attn->c_attn->parallel();
  if (shard && shard->sequence_parallel)
    throw Error(
        "pipeline parallelism: the GPT's stages do not run under sequence parallelism yet; set "
        "fabric.model_parallel.sequence_parallel: false");
  for (int64_t k : stages) {
    if (k < 0 || k >= stage_count)
      throw Error("GPTStages: stage " + std::to_string(k) + " is not one of the " +
                  std::to_string(stage_count) + " stages (0 .. " + std::to_string(stage_count - 1) +
                  ")");
    ranges_[k] = split[static_cast<size_t>(k)];
  }
  auto transformer = register_module("transformer", std::make_shared<torch::nn::Module>());
  if (holds_first() || holds_last()) wte = transformer->register_module("wte", whole->wte);
  if (holds_first()) {
    wpe = transformer->register_module("wpe", whole->wpe);
    drop = transformer->register_module("drop", whole->drop);
  }
  auto h = transformer->register_module("h", std::make_shared<torch::nn::Module>());
  for (const auto& [k, range] : ranges_)
    for (int64_t i = range.first; i < range.second; ++i)
      blocks.emplace(i, h->register_module(std::to_string(i), whole->blocks[i]));
  if (holds_last()) ln_f = transformer->register_module("ln_f", whole->ln_f);
}

std::pair<int64_t, int64_t> GPTStagesImpl::blocks_of(int64_t stage) const {
  auto it = ranges_.find(stage);
  if (it == ranges_.end())
    throw Error("GPTStages: stage " + std::to_string(stage) + " is not held by this rank");
  return it->second;
}

torch::Tensor GPTStagesImpl::forward(int64_t stage, const torch::Tensor& input) {
  const auto [begin, end] = blocks_of(stage);
  torch::Tensor x = stage == 0 ? gpt_embed(config_, wte, wpe, drop, input) : input;
  for (int64_t i = begin; i < end; ++i) x = blocks.at(i)->forward(x);
  return x;
}

torch::Tensor GPTStagesImpl::loss(const torch::Tensor& x, const torch::Tensor& targets) {
  if (!holds_last())
    throw Error("GPTStages::loss: the last stage (" + std::to_string(stage_count_ - 1) +
                ") is not held by this rank");
  return gpt_head_loss(config_, wte, gpt_final_norm(config_, ln_f, x), targets);
}

}  // namespace fabric::models
