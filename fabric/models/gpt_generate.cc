#include "fabric/models/gpt_generate.h"

#include <torch/types.h>

#include <string>

#include "fabric/core/error.h"

namespace fabric::models {

namespace {

// The GPT's blocks and output on one step (decode::Decoder::forward): token and learned position
// embeddings at each row's own positions, attention over the cache; the logits of the last
// position, float [B, V]. The LayerNorms as the training path computes them (gpt_final_norm:
// fused with a 16-bit output where it applies).
torch::Tensor gpt_step(GPTImpl& model, const decode::Step& s,
                       std::vector<decode::LayerCache>& caches) {
  const GPTConfig& c = model.config();
  const int64_t B = s.tokens.size(0), T = s.tokens.size(1), D = c.n_embd / c.n_head;
  torch::Tensor x = model.wte->forward(s.tokens) + model.wpe->forward(s.positions);
  auto split = [&](const torch::Tensor& t) {
    return t.view({B, T, -1, D}).transpose(1, 2);  // [B, heads here, T, D]
  };
  for (size_t i = 0; i < model.blocks.size(); ++i) {
    BlockImpl& block = *model.blocks[i];
    CausalSelfAttentionImpl& attn = *block.attn;
    // q, k and v: thirds of c_attn's output (under tensor parallelism of this rank's slice of
    // each; c_proj, a row layer, sums the ranks' parts).
    const torch::Tensor out = attn.c_attn->forward(gpt_final_norm(c, block.ln_1, x));
    const auto qkv = out.split(out.size(2) / 3, 2);
    torch::Tensor y = s.attend(caches[i], split(qkv[0]), split(qkv[1]), split(qkv[2]));
    y = y.transpose(1, 2).contiguous().view({B, T, -1});
    x = x + attn.c_proj->forward(y);
    x = x + block.mlp->forward(gpt_final_norm(c, block.ln_2, x));
  }
  const torch::Tensor last =
      gpt_final_norm(c, model.ln_f, x.select(1, T - 1).contiguous());  // [B, C]
  return fabric::nn::tied_logits(last, model.wte).to(torch::kFloat);
}

}  // namespace

GenerateOutput generate(GPTImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o) {
  const GPTConfig& c = model.config();
  if (!model.blocks.empty()) {
    const CausalSelfAttentionImpl& attn = *model.blocks[0]->attn;
    decode::check_parallelism(attn.c_attn->parallel() && attn.c_attn->parallel()->sequence_parallel,
                              attn.context_parallel != nullptr);
  }
  decode::Decoder d;
  d.layers = static_cast<int64_t>(model.blocks.size());
  // This rank's heads: all, or c_attn's slice (a third of its rows each for q, k, v) under tp.
  d.kv_heads = model.blocks.empty()
                   ? c.n_head
                   : model.blocks[0]->attn->c_attn->weight.size(0) / 3 / (c.n_embd / c.n_head);
  d.head_dim = c.n_embd / c.n_head;
  d.vocab_size = c.vocab_size;
  d.max_positions = c.block_size;
  d.positions_key = "block_size (config.json's n_positions)";
  d.options = model.wte->weight.options();
  d.forward = [&](const decode::Step& s, std::vector<decode::LayerCache>& caches) {
    return gpt_step(model, s, caches);
  };
  return decode::generate(model, d, prompts, o);
}

}  // namespace fabric::models
