#include "fabric/models/llama_generate.h"

#include <torch/types.h>

#include <string>

#include "fabric/core/error.h"
#include "fabric/models/fused_llama_ops.h"

namespace fabric::models {

namespace {

// The Llama's layers and output on one step (decode::Decoder::forward): rotary angles from each
// row's own positions, grouped-query attention over the cache; the logits of the last position,
// float [B, V].
torch::Tensor llama_step(LlamaImpl& model, const torch::Tensor& inv_freq, const decode::Step& s,
                         std::vector<decode::LayerCache>& caches) {
  const LlamaConfig& c = model.config();
  const int64_t B = s.tokens.size(0), T = s.tokens.size(1);
  // The heads on this rank: all of them, or under tensor parallelism the q/k/v projections'
  // slices (column layers; o_proj, a row layer, sums the ranks' parts).
  const int64_t D = c.resolved_head_dim();
  torch::Tensor x = model.embed_tokens->forward(s.tokens);
  // Rotary angles [B, 1, T, D] from each row's own positions (float32, as the training path).
  const torch::Tensor half =
      s.positions.to(torch::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});  // [B, T, D/2]
  const torch::Tensor angles = torch::cat({half, half}, -1).unsqueeze(1);
  const torch::Tensor cos = angles.cos().to(x.scalar_type()),
                      sin = angles.sin().to(x.scalar_type());
  auto split = [&](const torch::Tensor& t) {
    return t.view({B, T, -1, D}).transpose(1, 2);  // [B, heads here, T, D]
  };
  auto rotate = [&](const torch::Tensor& t) { return t * cos + rotate_half(t) * sin; };
  for (size_t i = 0; i < model.layers.size(); ++i) {
    LlamaDecoderLayerImpl& layer = *model.layers[i];
    LlamaAttentionImpl& attn = *layer.self_attn;
    const torch::Tensor h = layer.input_layernorm->forward(x);
    torch::Tensor y =
        s.attend(caches[i], rotate(split(attn.q_proj->forward(h))),
                 rotate(split(attn.k_proj->forward(h))), split(attn.v_proj->forward(h)));
    y = y.transpose(1, 2).contiguous().view({B, T, -1});
    x = x + attn.o_proj->forward(y);
    x = x + layer.mlp->forward(layer.post_attention_layernorm->forward(x));
  }
  const torch::Tensor last = model.norm->forward(x.select(1, T - 1));  // [B, hidden]
  torch::Tensor logits = model.lm_head ? model.lm_head->forward(last)
                                       : fabric::nn::tied_logits(last, model.embed_tokens);
  // A vocabulary-parallel lm_head: this rank's columns, gathered whole (tied_logits gathers).
  if (model.lm_head && model.lm_head->parallel())
    logits = fabric::nn::gather_from_parallel(logits, model.lm_head->parallel()->group, -1);
  return logits.to(torch::kFloat);
}

}  // namespace

GenerateOutput generate(LlamaImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o) {
  const LlamaConfig& c = model.config();
  if (!model.layers.empty()) {
    const LlamaAttentionImpl& attn = *model.layers[0]->self_attn;
    decode::check_parallelism(attn.q_proj->parallel() && attn.q_proj->parallel()->sequence_parallel,
                              attn.context_parallel != nullptr);
  }
  const torch::Tensor& w = model.embed_tokens->weight;
  const torch::Tensor inv_freq = llama_rope_inv_freq(c).to(w.device());
  decode::Decoder d;
  d.layers = static_cast<int64_t>(model.layers.size());
  // This rank's key/value heads: all, or k_proj's slice under tensor parallelism.
  d.kv_heads = model.layers.empty()
                   ? c.num_key_value_heads
                   : model.layers[0]->self_attn->k_proj->weight.size(0) / c.resolved_head_dim();
  d.head_dim = c.resolved_head_dim();
  d.vocab_size = c.vocab_size;
  d.max_positions = c.max_position_embeddings;
  d.positions_key = "max_position_embeddings";
  d.sliding_window = c.sliding_window;
  d.options = w.options();
  d.forward = [&](const decode::Step& s, std::vector<decode::LayerCache>& caches) {
    return llama_step(model, inv_freq, s, caches);
  };
  return decode::generate(model, d, prompts, o);
}

}  // namespace fabric::models
