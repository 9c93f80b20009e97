// fabric::models::GPTStages: the part of a GPT (fabric/models/gpt.h) that one pipeline-parallel
// rank holds (issue 71), and how its stages run.
//
// The model is cut by blocks: model.n_layer blocks over `stage_count` virtual stages, n_layer /
// stage_count consecutive blocks each (fabric::distributed::split_stage_units: an uneven cut is
// an error naming the counts that divide). Stage 0 also holds the embeddings (wte, wpe, dropout),
// the last stage the final LayerNorm and the output layer, which is tied to wte: when the first
// and the last stage are on different ranks both hold a copy of wte, and its two gradients must
// be summed between them after backward (PipelineRunner::sum_between) before the optimizer
// steps, as Megatron's embedding group does.
//
// The modules are the whole model's own (shared, not copied), registered under the whole model's
// names (transformer.wte.weight, transformer.h.3.attn.c_attn.weight, ...), so this rank's
// parameters and state dict are its pieces of the whole one's; once the whole GPT is gone, the
// blocks of other ranks' stages are freed and a rank holds about 1 / pp of the model.
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
#ifndef FABRIC_MODELS_GPT_PIPELINE_H_
#define FABRIC_MODELS_GPT_PIPELINE_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "fabric/models/gpt.h"

namespace fabric::models {

class GPTStagesImpl : public torch::nn::Module {
 public:
  // `whole`'s modules for the virtual stages `stages` of a pipeline of `stage_count` stages.
  // fabric::Error: stage_count does not divide model.n_layer (split_stage_units' message), a
  // stage outside 0 .. stage_count - 1, or a model under sequence parallelism (not supported).
  GPTStagesImpl(const GPT& whole, const std::vector<int64_t>& stages, int64_t stage_count);

  // Stage `stage`'s forward: from token ids [B, T] (stage 0) or the previous stage's output
  // [B, T, C], through its blocks, to [B, T, C] float32 (the residual stream).
  torch::Tensor forward(int64_t stage, const torch::Tensor& input);
  // The last stage's mean cross-entropy from its forward output: final LayerNorm, output layer,
  // loss, as GPT::loss computes them.
  torch::Tensor loss(const torch::Tensor& x, const torch::Tensor& targets);

  bool holds(int64_t stage) const { return ranges_.count(stage) > 0; }
  bool holds_first() const { return holds(0); }
  bool holds_last() const { return holds(stage_count_ - 1); }
  int64_t stage_count() const { return stage_count_; }
  // The blocks [begin, end) of a stage this rank holds.
  std::pair<int64_t, int64_t> blocks_of(int64_t stage) const;
  const GPTConfig& config() const { return config_; }

  fabric::nn::Embedding wte{nullptr};  // stages 0 and last
  torch::nn::Embedding wpe{nullptr};   // stage 0
  torch::nn::Dropout drop{nullptr};    // stage 0
  torch::nn::LayerNorm ln_f{nullptr};  // the last stage
  std::map<int64_t, Block> blocks;     // by the block's index in the whole model

 private:
  GPTConfig config_;
  int64_t stage_count_;
  std::map<int64_t, std::pair<int64_t, int64_t>> ranges_;
};
TORCH_MODULE(GPTStages);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_GPT_PIPELINE_H_
