// fabric::models::GPTStages, LlamaStages and SequentialStages: the part of a GPT
// (fabric/models/gpt.h), a Llama (fabric/models/llama.h: Llama, Qwen2, Mistral) or a user's
// torch::nn::Sequential that one pipeline-parallel rank holds (issue 71), and how its stages run
// (fabric/distributed/pipeline_runtime.h runs them).
//
// A model is cut by blocks: its N blocks over `stage_count` virtual stages, N / stage_count
// consecutive blocks each (fabric::distributed::split_stage_units: an uneven cut is an error
// naming the counts that divide). Stage 0 also holds the token embedding (the GPT's positions and
// dropout too), the last stage the final norm and the output layer. An output layer tied to the
// embedding (the GPT's always, a Llama's with tie_word_embeddings) is held by both: when the
// first and the last stage are on different ranks each has a copy, and its two gradients must be
// summed between them after backward (PipelineRunner::sum_between on tied_weight()) before the
// optimizer steps, as Megatron's embedding group does.
//
// The modules are the whole model's own (shared, not copied), registered under the whole model's
// names (transformer.h.3.attn.c_attn.weight, model.layers.3.self_attn.q_proj.weight, ...), so
// this rank's parameters and state dict are its pieces of the whole one's; once the whole model is
// gone, the blocks of other ranks' stages are freed and a rank holds about 1 / pp of the model.
// A model split over tp first (fabric::nn::parallelize) keeps its slices; sequence parallelism is
// refused (not supported yet).
//
//   GPT whole(config);                                        // same values on every rank
//   GPTStages mine(whole, runner.local_stages(), runner.stages());
//   calls.forward = [&](int64_t k, int64_t mb, const torch::Tensor& in) {
//     return mine->forward(k, k == 0 ? tokens[mb] : in);
//   };
//   calls.loss = [&](int64_t mb, const torch::Tensor& out) { return mine->loss(out, targets[mb]);
//   };
//
// Thread-safety: as any torch::nn::Module.
#ifndef FABRIC_MODELS_PIPELINE_STAGES_H_
#define FABRIC_MODELS_PIPELINE_STAGES_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"
#include "fabric/nn/pipeline_staged.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::models {

// What the stages of every model share: which stages this rank holds, and their blocks.
// The stages carry the whole model's tensor-parallel plan, its rules for modules other ranks
// hold left out, so fabric.strategy: model_parallel splits them over tp like the whole model.
class PipelineStagesImpl : public torch::nn::Module,
                           public fabric::nn::TensorParallelPlanned,
                           public fabric::nn::PipelineStaged {
 public:
  fabric::nn::TensorParallelPlan tensor_parallel_plan() const override;
  bool holds(int64_t stage) const { return ranges_.count(stage) > 0; }
  bool holds_first() const { return holds(0); }
  bool holds_last() const { return holds(stage_count_ - 1); }
  int64_t stage_count() const { return stage_count_; }
  // The blocks [begin, end) of a stage this rank holds (fabric::Error for another).
  std::pair<int64_t, int64_t> blocks_of(int64_t stage) const;
  // Every block of the stages this rank holds, in model order.
  std::vector<int64_t> held_blocks() const;
  // The embedding's weight where the output layer is tied to it and this rank holds it (undefined
  // otherwise): what PipelineRunner::sum_between sums between the first and the last stage.
  virtual torch::Tensor tied_weight() const = 0;

 protected:
  // `blocks` blocks (named by `what`, e.g. "model.n_layer") over `stage_count` stages, of which
  // this rank holds `stages`. fabric::Error: an uneven cut, a stage out of range, or
  // `sequence_parallel`.
  PipelineStagesImpl(int64_t blocks, const std::vector<int64_t>& stages, int64_t stage_count,
                     const std::string& what, bool sequence_parallel);
  // The same with each stage's [begin, end) blocks given.
  PipelineStagesImpl(std::vector<std::pair<int64_t, int64_t>> split,
                     const std::vector<int64_t>& stages);
  // `child` registered at the dotted `path` under this module ("model.layers.3"), the parents
  // made as plain modules where they do not exist yet.
  // The whole model's plan (tensor_parallel_plan keeps the rules that match a held module).
  void set_whole_plan(fabric::nn::TensorParallelPlan plan) { whole_plan_ = std::move(plan); }
  template <typename M>
  M hold(const std::string& path, M child) {
    const auto dot = path.rfind('.');
    torch::nn::Module& parent = dot == std::string::npos ? *this : folder(path.substr(0, dot));
    return parent.register_module(path.substr(dot == std::string::npos ? 0 : dot + 1), child);
  }

 private:
  torch::nn::Module& folder(const std::string& path);
  fabric::nn::TensorParallelPlan whole_plan_;
  int64_t stage_count_;
  std::map<int64_t, std::pair<int64_t, int64_t>> ranges_;
};

class GPTStagesImpl : public PipelineStagesImpl {
 public:
  // `whole`'s modules for the virtual stages `stages` of a pipeline of `stage_count` stages.
  GPTStagesImpl(const GPT& whole, const std::vector<int64_t>& stages, int64_t stage_count);
  // Stage `stage`'s forward: from token ids [B, T] (stage 0) or the previous stage's output
  // [B, T, C], through its blocks, to [B, T, C] float32 (the residual stream).
  torch::Tensor forward(int64_t stage, const torch::Tensor& input);
  // The last stage's mean cross-entropy from its forward output: final LayerNorm, output layer,
  // loss, as GPT::loss computes them.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& targets);
  torch::Tensor tied_weight() const override { return wte ? wte->weight : torch::Tensor(); }
  const GPTConfig& config() const { return config_; }

  fabric::nn::Embedding wte{nullptr};  // stages 0 and last
  torch::nn::Embedding wpe{nullptr};   // stage 0
  torch::nn::Dropout drop{nullptr};    // stage 0
  torch::nn::LayerNorm ln_f{nullptr};  // the last stage
  std::map<int64_t, Block> blocks;     // by the block's index in the whole model

 private:
  GPTConfig config_;
};
TORCH_MODULE(GPTStages);

class LlamaStagesImpl : public PipelineStagesImpl {
 public:
  LlamaStagesImpl(const Llama& whole, const std::vector<int64_t>& stages, int64_t stage_count);
  // As GPTStages: token ids [B, T] (stage 0) or [B, T, hidden] → [B, T, hidden].
  torch::Tensor forward(int64_t stage, const torch::Tensor& input);
  // The last stage's mean cross-entropy: model.norm, lm_head (or the tied embedding), loss.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& targets);
  torch::Tensor tied_weight() const override;
  const LlamaConfig& config() const { return config_; }

  fabric::nn::Embedding embed_tokens{nullptr};  // stage 0 (and the last when tied)
  RMSNorm norm{nullptr};                        // the last stage
  fabric::nn::Linear lm_head{nullptr};          // the last stage, untied
  std::map<int64_t, LlamaDecoderLayer> layers;  // by the layer's index in the whole model

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaStages);

// A user's model as a torch::nn::Sequential, cut at split points: stage k runs modules
// [splits[k - 1], splits[k]) (splits[-1] = 0, the last stage runs to the end), held under the
// Sequential's own names ("0", "1", ...). No split points: the modules split evenly
// (split_stage_units). The loss is the caller's (PipelineStageCalls::loss on the last stage's
// output); nothing is tied.
//
//   torch::nn::Sequential net(embed, block0, block1, block2, block3, head);
//   SequentialStages mine(net, runner.local_stages(), 2, {3});  // [embed, b0, b1] | [b2, b3, head]
class SequentialStagesImpl : public PipelineStagesImpl {
 public:
  // fabric::Error: split points not strictly increasing inside 1 .. size - 1, a count of them
  // other than stage_count - 1, or (none given) a size stage_count does not divide.
  SequentialStagesImpl(const torch::nn::Sequential& whole, const std::vector<int64_t>& stages,
                       int64_t stage_count, const std::vector<int64_t>& split_points = {});
  // Stage `stage`'s modules in order on `input` (the batch's input on stage 0).
  torch::Tensor forward(int64_t stage, const torch::Tensor& input);
  torch::Tensor tied_weight() const override { return torch::Tensor(); }

 private:
  std::map<int64_t, torch::nn::AnyModule> modules_;  // by index in the whole Sequential
};
TORCH_MODULE(SequentialStages);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_PIPELINE_STAGES_H_
