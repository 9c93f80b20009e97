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
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads,
                D = c.resolved_head_dim();
  torch::Tensor x = model.embed_tokens->forward(s.tokens);
  // Rotary angles [B, 1, T, D] from each row's own positions (float32, as the training path).
  const torch::Tensor half =
      s.positions.to(torch::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});  // [B, T, D/2]
  const torch::Tensor angles = torch::cat({half, half}, -1).unsqueeze(1);
  const torch::Tensor cos = angles.cos().to(x.scalar_type()),
                      sin = angles.sin().to(x.scalar_type());
  auto split = [&](const torch::Tensor& t, int64_t n) {
    return t.view({B, T, n, D}).transpose(1, 2);  // [B, n, T, D]
  };
  auto rotate = [&](const torch::Tensor& t) { return t * cos + rotate_half(t) * sin; };
  for (size_t i = 0; i < model.layers.size(); ++i) {
    LlamaDecoderLayerImpl& layer = *model.layers[i];
    LlamaAttentionImpl& attn = *layer.self_attn;
    const torch::Tensor h = layer.input_layernorm->forward(x);
    torch::Tensor y = s.attend(caches[i], rotate(split(attn.q_proj->forward(h), heads)),
                               rotate(split(attn.k_proj->forward(h), kv_heads)),
                               split(attn.v_proj->forward(h), kv_heads));
    y = y.transpose(1, 2).contiguous().view({B, T, heads * D});
    x = x + attn.o_proj->forward(y);
    x = x + layer.mlp->forward(layer.post_attention_layernorm->forward(x));
  }
  const torch::Tensor last = model.norm->forward(x.select(1, T - 1));  // [B, hidden]
  const torch::Tensor logits = model.lm_head ? model.lm_head->forward(last)
                                             : fabric::nn::tied_logits(last, model.embed_tokens);
  return logits.to(torch::kFloat);
}

}  // namespace

GenerateOutput generate(LlamaImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o) {
  const LlamaConfig& c = model.config();
  if (model.embed_tokens->parallel() ||
      (!model.layers.empty() && model.layers[0]->self_attn->q_proj->parallel()))
    throw Error("generate: a tensor-parallel model is not supported; generate on one device");
  const torch::Tensor& w = model.embed_tokens->weight;
  const torch::Tensor inv_freq = llama_rope_inv_freq(c).to(w.device());
  decode::Decoder d;
  d.layers = static_cast<int64_t>(model.layers.size());
  d.kv_heads = c.num_key_value_heads;
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
