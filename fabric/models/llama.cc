#include "fabric/models/llama.h"

#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/models/context_parallel.h"
#include "fabric/models/fused_cross_entropy.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/ring_attention.h"
#include "fabric/nn/ring_attention_dist.h"

namespace fabric::models {

void LlamaConfig::validate() const {
  auto positive = [](int64_t v, const char* key) {
    if (v < 1)
      throw Error(std::string("LlamaConfig.") + key + ": " + std::to_string(v) +
                  " must be at least 1");
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(max_position_embeddings, "max_position_embeddings");
  if (num_attention_heads % num_key_value_heads != 0)
    throw Error("LlamaConfig.num_key_value_heads: " + std::to_string(num_key_value_heads) +
                " does not divide num_attention_heads " + std::to_string(num_attention_heads) +
                "; each key/value head serves a whole group of query heads");
  if (head_dim == 0 && hidden_size % num_attention_heads != 0)
    throw Error("LlamaConfig.hidden_size: " + std::to_string(hidden_size) +
                " is not a multiple of num_attention_heads " + std::to_string(num_attention_heads) +
                "; set head_dim");
  if (resolved_head_dim() % 2 != 0)
    throw Error("LlamaConfig.head_dim: " + std::to_string(resolved_head_dim()) +
                " must be even (rotary embeddings rotate pairs)");
  if (rope_type != "default" && rope_type != "llama3")
    throw Error("LlamaConfig.rope_type: '" + rope_type + "' is not default or llama3");
}

int64_t LlamaConfig::parameters() const {
  const int64_t C = hidden_size, D = resolved_head_dim(), H = num_attention_heads,
                KV = num_key_value_heads, I = intermediate_size;
  const int64_t bias = attention_bias ? (H + 2 * KV) * D + C : qkv_bias ? (H + 2 * KV) * D : 0;
  const int64_t per_layer = 2 * C + C * H * D + 2 * C * KV * D + H * D * C + bias + 3 * C * I;
  return vocab_size * C * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * per_layer + C;
}

double LlamaConfig::flops_per_token(int64_t sequence) const {
  const int64_t lookup = tie_word_embeddings ? 0 : vocab_size * hidden_size;
  const double n = static_cast<double>(parameters() - lookup);
  return 6 * n + 12.0 * static_cast<double>(num_hidden_layers * num_attention_heads *
                                            resolved_head_dim() * sequence);
}

torch::Tensor llama_rope_inv_freq(const LlamaConfig& c) {
  const int64_t dim = c.resolved_head_dim();
  // In float32, as Hugging Face computes them (bit for bit the same frequencies); real tensors
  // under an empty init too (a constant, not a parameter: fabric/nn/empty_init.h).
  const fabric::NotRecorded real;
  const torch::Tensor exponents = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  torch::Tensor inv_freq = 1.0 / torch::pow(c.rope_theta, exponents);
  if (c.rope_type == "llama3") {
    // Llama 3.1's scaling: long wavelengths (beyond the original context / low_freq_factor) are
    // stretched by `factor`, short ones (below it / high_freq_factor) kept, and the band between
    // interpolated smoothly.
    const double old_context = static_cast<double>(c.rope_original_max_position_embeddings);
    const double low_wavelen = old_context / c.rope_low_freq_factor;
    const double high_wavelen = old_context / c.rope_high_freq_factor;
    const torch::Tensor wavelen = 2 * std::numbers::pi / inv_freq;
    torch::Tensor scaled = torch::where(wavelen > low_wavelen, inv_freq / c.rope_factor, inv_freq);
    const torch::Tensor smooth = (old_context / wavelen - c.rope_low_freq_factor) /
                                 (c.rope_high_freq_factor - c.rope_low_freq_factor);
    const torch::Tensor smoothed = (1 - smooth) * scaled / c.rope_factor + smooth * scaled;
    const torch::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
    inv_freq = torch::where(medium, smoothed, scaled);
  }
  return inv_freq;
}

LlamaImpl::LlamaImpl(const LlamaConfig& c) : config_(c) {
  c.validate();
  auto model = register_module("model", std::make_shared<torch::nn::Module>());
  embed_tokens =
      model->register_module("embed_tokens", fabric::nn::Embedding(c.vocab_size, c.hidden_size));
  {
    torch::NoGradGuard no_grad;
    torch::nn::init::normal_(embed_tokens->weight, 0.0, 0.02);
  }
  torch::nn::ModuleList list;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.push_back(LlamaDecoderLayer(c));
    list->push_back(layers.back());
  }
  model->register_module("layers", list);
  norm = model->register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  if (!c.tie_word_embeddings)
    lm_head = register_module("lm_head", llama_linear(c.hidden_size, c.vocab_size, false));
}

const torch::Tensor& LlamaImpl::output_weight() const {
  return lm_head ? lm_head->weight : embed_tokens->weight;
}

torch::Tensor LlamaImpl::hidden(const torch::Tensor& tokens, const RunBlock& run_block) {
  return hidden(tokens, run_block, /*whole=*/true);
}

namespace {

// fabric::Error for token ids that are not [B, T], or a whole sequence longer than the config
// allows; cp > 0: the tokens are one of cp context-parallel ranks' share, the sequence cp times
// as long.
void check_tokens(const LlamaConfig& c, const torch::Tensor& tokens, int64_t cp) {
  if (tokens.dim() != 2) throw Error("Llama::forward: tokens must be [B, T] token ids");
  const int64_t T = tokens.size(1) * std::max<int64_t>(cp, 1);
  const std::string sequence = "Llama::forward: a sequence of " + std::to_string(T) + " tokens" +
                               (cp > 0 ? " (" + std::to_string(tokens.size(1)) + " on each of " +
                                             std::to_string(cp) + " context-parallel ranks)"
                                       : "");
  if (T > c.max_position_embeddings)
    throw Error(sequence + " is longer than max_position_embeddings " +
                std::to_string(c.max_position_embeddings));
  if (c.sliding_window > 0 && T > c.sliding_window)
    throw Error(sequence + " is longer than config.json's sliding_window " +
                std::to_string(c.sliding_window) +
                ", and sliding-window attention is not implemented; use shorter sequences");
}

}  // namespace

void llama_check_tokens(const LlamaConfig& c, const torch::Tensor& tokens) {
  check_tokens(c, tokens, /*cp=*/0);
}

torch::Tensor llama_head_loss(fabric::nn::Embedding& embed_tokens, fabric::nn::Linear& lm_head,
                              const torch::Tensor& h, const torch::Tensor& targets) {
  // An untied lm_head split by vocabulary (column): the loss from this rank's V / tp logits, the
  // whole logits never formed.
  if (const auto& p = lm_head ? lm_head->parallel() : std::nullopt) {
    const int64_t local = lm_head->weight.size(0);
    return fabric::nn::vocab_parallel_cross_entropy(lm_head->forward(h), targets, p->rank * local,
                                                    p->group);
  }
  if (const auto& p = lm_head ? std::nullopt : embed_tokens->parallel()) {
    const torch::Tensor logits =
        torch::linear(fabric::nn::copy_to_parallel(h, p->group), embed_tokens->weight);
    return fabric::nn::vocab_parallel_cross_entropy(logits, targets, embed_tokens->vocab_start(),
                                                    p->group);
  }
  // An lm_head with a LoRA adapter (peft may target it) or a stored base: the loss from its own
  // forward (the raw weight left the adapter out of the loss: it never trained). Under fp8 the
  // head keeps the fused loss on its weight, as before (torchao and TorchTitan keep the output
  // layer out of float8).
  if (lm_head && (lm_head->lora_rank() > 0 || lm_head->weight_scale().defined()))
    return lm_loss(lm_head->forward(h), targets);
  return linear_cross_entropy(h, lm_head ? lm_head->weight : embed_tokens->weight, targets,
                              /*fused=*/true);
}

torch::Tensor LlamaImpl::hidden(const torch::Tensor& tokens, const RunBlock& run_block,
                                bool whole) {
  if (!layers.empty() && layers[0]->self_attn->context_parallel) {
    // This rank's share of each sequence; the layers take their positions from the group. The
    // length is checked here, before any layer communicates (every rank holds the same shapes).
    const int64_t cp = layers[0]->self_attn->context_parallel->group->getSize();
    check_tokens(config_, tokens, cp);
    fabric::nn::cp_chunk_size(tokens.size(1) * cp, cp);
    torch::Tensor x = embed_tokens->forward(tokens);
    for (LlamaDecoderLayer& layer : layers) x = run_block ? run_block(layer, x) : layer->forward(x);
    return llama_final_norm(config_, norm, x);
  }
  llama_check_tokens(config_, tokens);
  const int64_t T = tokens.size(1);
  // Sequence parallelism (a plan's): the layers run on this rank's positions, the sequence padded
  // to a multiple of tp (causal attention keeps the padding out of the real positions) and the
  // output gathered whole for the output layer.
  const auto& shard =
      layers.empty() ? embed_tokens->parallel() : layers[0]->self_attn->q_proj->parallel();
  if (shard && shard->sequence_parallel) {
    const int64_t pad = (shard->size - T % shard->size) % shard->size;
    if (T + pad > config_.max_position_embeddings)
      throw Error("Llama::forward: sequence parallelism pads " + std::to_string(T) + " tokens to " +
                  std::to_string(T + pad) + ", more than max_position_embeddings " +
                  std::to_string(config_.max_position_embeddings) +
                  "; use sequences of a multiple of tp");
    const torch::Tensor ids =
        pad > 0 ? torch::cat({tokens, torch::zeros({tokens.size(0), pad}, tokens.options())}, 1)
                : tokens;
    torch::Tensor x = fabric::nn::enter_sequence_parallel(embed_tokens->forward(ids), shard);
    for (LlamaDecoderLayer& layer : layers) x = run_block ? run_block(layer, x) : layer->forward(x);
    x = llama_rms_norm(norm, x, shard);
    if (!whole) return x;  // this rank's positions of the padded sequence
    x = fabric::nn::leave_sequence_parallel(x, shard);
    return pad > 0 ? x.narrow(1, 0, T) : x;
  }
  torch::Tensor x = embed_tokens->forward(tokens);
  for (LlamaDecoderLayer& layer : layers) x = run_block ? run_block(layer, x) : layer->forward(x);
  return llama_final_norm(config_, norm, x);
}

void LlamaImpl::set_context_parallel(fabric::nn::ProcessGroupPtr group) {
  const auto& shard =
      layers.empty() ? embed_tokens->parallel() : layers[0]->self_attn->q_proj->parallel();
  if (group && shard && shard->sequence_parallel)
    throw Error(
        "Llama context parallelism does not compose with sequence parallelism yet; set "
        "fabric.model_parallel.sequence_parallel: false");
  const auto cp =
      group ? std::make_shared<const ContextParallelGroup>(ContextParallelGroup{std::move(group)})
            : nullptr;
  for (LlamaDecoderLayer& layer : layers) layer->self_attn->context_parallel = cp;
}

torch::Tensor LlamaImpl::split_head_logits(const torch::Tensor& tokens, const RunBlock& run_block) {
  if (!lm_head->parallel()->sequence_parallel) return lm_head->forward(hidden(tokens, run_block));
  // Under sequence parallelism lm_head gathers the positions itself (then drops the padding).
  const torch::Tensor logits = lm_head->forward(hidden(tokens, run_block, /*whole=*/false));
  return logits.narrow(1, 0, tokens.size(1));
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& tokens, const RunBlock& run_block) {
  if (!lm_head) return fabric::nn::tied_logits(hidden(tokens, run_block), embed_tokens);
  // Vocabulary-parallel: this rank's V / tp columns, gathered whole.
  if (const auto& p = lm_head->parallel()) {
    const torch::Tensor logits = split_head_logits(tokens, run_block);
    return fabric::nn::gather_from_parallel(logits, p->group, logits.dim() - 1);
  }
  return lm_head->forward(hidden(tokens, run_block));
}

torch::Tensor LlamaImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                              const RunBlock& run_block) {
  // An untied lm_head split by vocabulary under sequence parallelism gathers the positions itself.
  if (const auto& p = lm_head ? lm_head->parallel() : std::nullopt; p && p->sequence_parallel) {
    const int64_t local = lm_head->weight.size(0);
    return fabric::nn::vocab_parallel_cross_entropy(split_head_logits(tokens, run_block), targets,
                                                    p->rank * local, p->group);
  }
  return llama_head_loss(embed_tokens, lm_head, hidden(tokens, run_block), targets);
}

fabric::nn::TensorParallelPlan LlamaImpl::tensor_parallel_plan() const {
  return llama_tensor_parallel_plan(config_);
}

fabric::nn::TensorParallelPlan llama_tensor_parallel_plan(const LlamaConfig& c) {
  using Style = fabric::nn::TensorParallelStyle;
  const int64_t d = c.resolved_head_dim();
  const char* heads = "attention heads (num_attention_heads)";
  const char* kv_heads = "key/value heads (num_key_value_heads)";
  fabric::nn::TensorParallelPlan plan{
      {{"model.embed_tokens", Style::vocab()},
       {"model.layers.*.self_attn.q_proj", Style::column().in_units(d, heads)},
       {"model.layers.*.self_attn.k_proj", Style::column().in_units(d, kv_heads)},
       {"model.layers.*.self_attn.v_proj", Style::column().in_units(d, kv_heads)},
       {"model.layers.*.self_attn.o_proj", Style::row().in_units(d, heads)},
       {"model.layers.*.mlp.gate_proj", Style::column()},
       {"model.layers.*.mlp.up_proj", Style::column()},
       {"model.layers.*.mlp.down_proj", Style::row()}}};
  // Untied: the output layer by vocabulary (its rows); tied, the embedding's rule holds.
  if (!c.tie_word_embeddings) plan.rules.emplace_back("lm_head", Style::column());
  return plan;
}

}  // namespace fabric::models
