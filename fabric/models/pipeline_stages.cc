#include "fabric/models/pipeline_stages.h"

#include <memory>
#include <string>

#include "fabric/core/error.h"
#include "fabric/distributed/pipeline_schedule.h"
#include "fabric/models/context_parallel.h"

namespace fabric::models {

PipelineStagesImpl::PipelineStagesImpl(int64_t blocks, const std::vector<int64_t>& stages,
                                       int64_t stage_count, const std::string& what,
                                       bool sequence_parallel)
    : PipelineStagesImpl(fabric::distributed::split_stage_units(blocks, stage_count, what),
                         stages) {
  if (sequence_parallel)
    throw Error(
        "pipeline parallelism: a model's stages do not run under sequence parallelism yet; set "
        "fabric.model_parallel.sequence_parallel: false");
}

fabric::nn::TensorParallelPlan PipelineStagesImpl::tensor_parallel_plan() const {
  fabric::nn::TensorParallelPlan plan = whole_plan_;
  const auto held = named_modules("", /*include_self=*/false);
  plan.rules.clear();
  for (const auto& rule : whole_plan_.rules)
    for (const auto& item : held)
      if (fabric::nn::plan_pattern_matches(rule.first, item.key())) {
        plan.rules.push_back(rule);
        break;
      }
  return plan;
}

PipelineStagesImpl::PipelineStagesImpl(std::vector<std::pair<int64_t, int64_t>> split,
                                       const std::vector<int64_t>& stages)
    : stage_count_(static_cast<int64_t>(split.size())) {
  const int64_t stage_count = stage_count_;
  for (int64_t k : stages) {
    if (k < 0 || k >= stage_count)
      throw Error("pipeline stages: stage " + std::to_string(k) + " is not one of the " +
                  std::to_string(stage_count) + " stages (0 .. " + std::to_string(stage_count - 1) +
                  ")");
    ranges_[k] = split[static_cast<size_t>(k)];
  }
}

std::pair<int64_t, int64_t> PipelineStagesImpl::blocks_of(int64_t stage) const {
  auto it = ranges_.find(stage);
  if (it == ranges_.end())
    throw Error("pipeline stages: stage " + std::to_string(stage) + " is not held by this rank");
  return it->second;
}

std::vector<int64_t> PipelineStagesImpl::held_blocks() const {
  std::vector<int64_t> out;
  for (const auto& [stage, range] : ranges_)
    for (int64_t i = range.first; i < range.second; ++i) out.push_back(i);
  return out;
}

torch::nn::Module& PipelineStagesImpl::folder(const std::string& path) {
  torch::nn::Module* at = this;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = std::min(path.find('.', start), path.size());
    const std::string name = path.substr(start, dot - start);
    const auto children = at->named_children();
    at = children.contains(name)
             ? children[name].get()
             : at->register_module(name, std::make_shared<torch::nn::Module>()).get();
    start = dot + 1;
  }
  return *at;
}

namespace {

template <typename Shard>
bool sequence_parallel(const Shard& shard) {
  return shard && shard->sequence_parallel;
}

}  // namespace

GPTStagesImpl::GPTStagesImpl(const GPT& whole, const std::vector<int64_t>& stages,
                             int64_t stage_count)
    : PipelineStagesImpl(
          whole->config().n_layer, stages, stage_count, "model.n_layer",
          sequence_parallel(whole->blocks.empty() ? whole->wte->parallel()
                                                  : whole->blocks[0]->attn->c_attn->parallel())),
      config_(whole->config()) {
  set_whole_plan(whole->tensor_parallel_plan());
  if (holds_first() || holds_last()) wte = hold("transformer.wte", whole->wte);
  if (holds_first()) {
    wpe = hold("transformer.wpe", whole->wpe);
    drop = hold("transformer.drop", whole->drop);
  }
  for (int64_t i : held_blocks())
    blocks.emplace(i, hold("transformer.h." + std::to_string(i), whole->blocks[i]));
  if (holds_last()) ln_f = hold("transformer.ln_f", whole->ln_f);
}

torch::Tensor GPTStagesImpl::forward(int64_t stage, const torch::Tensor& input) {
  const auto [begin, end] = blocks_of(stage);
  torch::Tensor x = input;
  if (stage == 0) {
    // Under context parallelism (the whole model's, set before the cut) the input is the rank's
    // share of each sequence: the learned positions at their global indices, as GPT::hidden.
    const auto& cp = begin < end ? blocks.at(begin)->attn->context_parallel : nullptr;
    x = cp ? drop->forward(wte->forward(input) + wpe->forward(context_parallel_positions(
                                                     *cp, input.size(1), input.device())))
           : gpt_embed(config_, wte, wpe, drop, input);
  }
  for (int64_t i = begin; i < end; ++i) x = blocks.at(i)->forward(x);
  return x;
}

torch::Tensor GPTStagesImpl::loss(const torch::Tensor& x, const torch::Tensor& targets) {
  blocks_of(stage_count() - 1);  // throws unless this rank holds the last stage
  return gpt_head_loss(config_, wte, gpt_final_norm(config_, ln_f, x), targets);
}

LlamaStagesImpl::LlamaStagesImpl(const Llama& whole, const std::vector<int64_t>& stages,
                                 int64_t stage_count)
    : PipelineStagesImpl(whole->config().num_hidden_layers, stages, stage_count,
                         "num_hidden_layers",
                         sequence_parallel(whole->layers.empty()
                                               ? whole->embed_tokens->parallel()
                                               : whole->layers[0]->self_attn->q_proj->parallel())),
      config_(whole->config()) {
  set_whole_plan(whole->tensor_parallel_plan());
  const bool tied = !whole->lm_head;
  if (holds_first() || (tied && holds_last()))
    embed_tokens = hold("model.embed_tokens", whole->embed_tokens);
  for (int64_t i : held_blocks())
    layers.emplace(i, hold("model.layers." + std::to_string(i), whole->layers[i]));
  if (holds_last()) {
    norm = hold("model.norm", whole->norm);
    if (!tied) lm_head = hold("lm_head", whole->lm_head);
  }
}

torch::Tensor LlamaStagesImpl::forward(int64_t stage, const torch::Tensor& input) {
  const auto [begin, end] = blocks_of(stage);
  torch::Tensor x = input;
  if (stage == 0) {
    llama_check_tokens(config_, input);
    x = embed_tokens->forward(input);
  }
  for (int64_t i = begin; i < end; ++i) x = layers.at(i)->forward(x);
  return x;
}

torch::Tensor LlamaStagesImpl::loss(const torch::Tensor& x, const torch::Tensor& targets) {
  blocks_of(stage_count() - 1);  // throws unless this rank holds the last stage
  return llama_head_loss(embed_tokens, lm_head, llama_final_norm(config_, norm, x), targets);
}

torch::Tensor LlamaStagesImpl::tied_weight() const {
  return config_.tie_word_embeddings && embed_tokens ? embed_tokens->weight : torch::Tensor();
}

namespace {

// The [begin, end) modules of each stage of a Sequential of `size` modules.
std::vector<std::pair<int64_t, int64_t>> sequential_split(int64_t size, int64_t stage_count,
                                                          const std::vector<int64_t>& points) {
  if (points.empty())
    return fabric::distributed::split_stage_units(size, stage_count, "the Sequential's modules");
  std::string given;
  for (int64_t p : points) given += (given.empty() ? "" : ", ") + std::to_string(p);
  if (static_cast<int64_t>(points.size()) != stage_count - 1)
    throw Error("pipeline split points {" + given + "}: " + std::to_string(points.size()) +
                " points cut " + std::to_string(points.size() + 1) + " stages, not " +
                std::to_string(stage_count) + "; give " + std::to_string(stage_count - 1) +
                " (where stages 1 .. " + std::to_string(stage_count - 1) + " start)");
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t p : points) {
    if (p <= begin || p >= size)
      throw Error("pipeline split points {" + given + "}: " + std::to_string(p) +
                  " does not start a stage of at least one module (points strictly increase "
                  "inside 1 .. " +
                  std::to_string(size - 1) + " for a Sequential of " + std::to_string(size) +
                  " modules)");
    out.emplace_back(begin, p);
    begin = p;
  }
  out.emplace_back(begin, size);
  return out;
}

}  // namespace

SequentialStagesImpl::SequentialStagesImpl(const torch::nn::Sequential& whole,
                                           const std::vector<int64_t>& stages, int64_t stage_count,
                                           const std::vector<int64_t>& split_points)
    : PipelineStagesImpl(
          sequential_split(static_cast<int64_t>(whole->size()), stage_count, split_points),
          stages) {
  const auto names = whole->named_children();
  for (int64_t i : held_blocks()) {
    const torch::nn::AnyModule& m = *(whole->begin() + i);
    register_module(names.keys()[static_cast<size_t>(i)], m.ptr());
    modules_.emplace(i, m);
  }
}

torch::Tensor SequentialStagesImpl::forward(int64_t stage, const torch::Tensor& input) {
  const auto [begin, end] = blocks_of(stage);
  torch::Tensor x = input;
  for (int64_t i = begin; i < end; ++i) x = modules_.at(i).forward(x);
  return x;
}

}  // namespace fabric::models
