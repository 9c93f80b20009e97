#include "fabric/models/llama_generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "fabric/core/error.h"
#include "fabric/models/fused_llama_ops.h"

namespace fabric::models {

namespace {

// Attention of one new position per row: q [B, heads, 1, D] over the cached keys and values
// [B, kv_heads, S, D], `blocked` [B, 1, 1, S] true where a row may not attend, in float32 (products
// of the model's dtype exact, as a fused kernel's float32 accumulation; autocast off), the result
// in q's dtype. Not SDPA: for a masked query on CUDA it picks cuDNN, which builds a graph for every
// key length S, i.e. every decode step: 4.6 ms of host time per layer and step on an H200, 18
// tokens/s for a 1B Llama (docs/benchmarks.md). Query head h reads key/value head h / (heads /
// kv_heads), as transformers' repeat_kv.
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const torch::Tensor& blocked) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t B = q.size(0), heads = q.size(1), D = q.size(3), kv_heads = k.size(1);
  // The heads sharing a key/value head as rows of one matrix: [B, kv_heads, heads / kv_heads, D].
  const torch::Tensor qg = q.reshape({B, kv_heads, heads / kv_heads, D}).to(torch::kFloat) *
                           (1.0 / std::sqrt(static_cast<double>(D)));
  const torch::Tensor p = torch::matmul(qg, k.to(torch::kFloat).transpose(-1, -2))
                              .masked_fill_(blocked, -std::numeric_limits<float>::infinity())
                              .softmax(-1);
  return torch::matmul(p, v.to(torch::kFloat)).to(q.scalar_type()).view({B, heads, 1, D});
}

// One layer's cached keys and values, [B, kv_heads, capacity, D] each.
struct LayerCache {
  torch::Tensor k, v;
};

// The layers and output of `model` for tokens [B, T] at rotary positions [B, T] (int64), the
// first `cached` positions of every row already in `caches` (and the new ones written there);
// key_valid [B, capacity] marks the positions a row may attend to (not its left padding). Returns
// the logits of the last position, float [B, V].
torch::Tensor step(LlamaImpl& model, std::vector<LayerCache>& caches, const torch::Tensor& tokens,
                   const torch::Tensor& positions, int64_t cached, const torch::Tensor& key_valid,
                   const torch::Tensor& inv_freq) {
  const LlamaConfig& c = model.config();
  const int64_t B = tokens.size(0), T = tokens.size(1), S = cached + T;
  const int64_t heads = c.num_attention_heads, kv_heads = c.num_key_value_heads,
                D = c.resolved_head_dim();
  torch::Tensor x = model.embed_tokens->forward(tokens);
  // Rotary angles [B, 1, T, D] from each row's own positions (float32, as the training path).
  const torch::Tensor half =
      positions.to(torch::kFloat).unsqueeze(-1) * inv_freq.view({1, 1, -1});  // [B, T, D/2]
  const torch::Tensor angles = torch::cat({half, half}, -1).unsqueeze(1);
  const torch::Tensor cos = angles.cos().to(x.scalar_type()),
                      sin = angles.sin().to(x.scalar_type());
  // Query t (at cache index cached + t) sees key s when s is a real token of its row and s <=
  // cached + t; every query also sees itself, so a padding query is never fully masked (its output
  // is never read, and it keeps NaNs out of the cache).
  const torch::Tensor s_index = torch::arange(S, tokens.options()).view({1, S});
  const torch::Tensor t_index = torch::arange(cached, S, tokens.options()).view({T, 1});
  const torch::Tensor causal = s_index <= t_index;  // [T, S]
  const torch::Tensor mask = key_valid.narrow(1, 0, S)
                                 .view({B, 1, 1, S})
                                 .logical_and(causal.view({1, 1, T, S}))
                                 .logical_or((s_index == t_index).view({1, 1, T, S}));
  const torch::Tensor blocked = T == 1 ? mask.logical_not() : torch::Tensor();  // [B, 1, 1, S]
  auto split = [&](const torch::Tensor& t, int64_t n) {
    return t.view({B, T, n, D}).transpose(1, 2);  // [B, n, T, D]
  };
  auto rotate = [&](const torch::Tensor& t) { return t * cos + rotate_half(t) * sin; };
  for (size_t i = 0; i < model.layers.size(); ++i) {
    LlamaDecoderLayerImpl& layer = *model.layers[i];
    LlamaAttentionImpl& attn = *layer.self_attn;
    const torch::Tensor h = layer.input_layernorm->forward(x);
    const torch::Tensor q = rotate(split(attn.q_proj->forward(h), heads));
    caches[i].k.narrow(2, cached, T).copy_(rotate(split(attn.k_proj->forward(h), kv_heads)));
    caches[i].v.narrow(2, cached, T).copy_(split(attn.v_proj->forward(h), kv_heads));
    const torch::Tensor keys = caches[i].k.narrow(2, 0, S), values = caches[i].v.narrow(2, 0, S);
    torch::Tensor y = T == 1 ? decode_attention(q, keys, values, blocked)
                             : at::scaled_dot_product_attention(
                                   q, keys, values, mask, /*dropout_p=*/0.0, /*is_causal=*/false,
                                   /*scale=*/std::nullopt, /*enable_gqa=*/heads != kv_heads);
    y = y.transpose(1, 2).contiguous().view({B, T, heads * D});
    x = x + attn.o_proj->forward(y);
    x = x + layer.mlp->forward(layer.post_attention_layernorm->forward(x));
  }
  const torch::Tensor last = model.norm->forward(x.select(1, T - 1));  // [B, hidden]
  const torch::Tensor logits = model.lm_head ? model.lm_head->forward(last)
                                             : fabric::nn::tied_logits(last, model.embed_tokens);
  return logits.to(torch::kFloat);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

torch::Tensor choose_next_tokens(const torch::Tensor& logits, const GenerateOptions& o,
                                 at::Generator& generator) {
  torch::Tensor l = logits.detach().to(torch::kCPU, torch::kFloat);
  if (o.temperature == 0) return l.argmax(-1);
  l = l / o.temperature;
  const int64_t V = l.size(-1);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (o.top_k > 0 && o.top_k < V) {
    const torch::Tensor kth = std::get<0>(l.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
    l = l.masked_fill(l < kth, kNegInf);
  }
  if (o.top_p < 1) {
    auto [sorted, order] = l.sort(-1, /*descending=*/true);
    const torch::Tensor p = sorted.softmax(-1);
    // Drop a token when the likelier ones already hold top_p (the likeliest is always kept).
    const torch::Tensor drop = (p.cumsum(-1) - p) >= o.top_p;
    sorted = sorted.masked_fill(drop, kNegInf);
    l = torch::full_like(l, kNegInf).scatter(-1, order, sorted);
  }
  return torch::multinomial(l.softmax(-1), 1, /*replacement=*/false, generator).squeeze(-1);
}

GenerateOutput generate(LlamaImpl& model, const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o) {
  const LlamaConfig& c = model.config();
  if (prompts.empty()) throw Error("generate: no prompts");
  if (o.max_new_tokens < 1)
    throw Error("generate: max_new_tokens " + std::to_string(o.max_new_tokens) +
                " must be at least 1");
  if (o.temperature < 0)
    throw Error("generate: temperature " + std::to_string(o.temperature) +
                " must be 0 (greedy) or positive");
  if (o.top_k < 0) throw Error("generate: top_k " + std::to_string(o.top_k) + " must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw Error("generate: top_p " + std::to_string(o.top_p) + " must be in (0, 1]");
  if (model.embed_tokens->parallel() ||
      (!model.layers.empty() && model.layers[0]->self_attn->q_proj->parallel()))
    throw Error("generate: a tensor-parallel model is not supported; generate on one device");
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t L = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& p = prompts[b];
    const std::string row = "generate: prompt " + std::to_string(b) + ": ";
    if (p.empty()) throw Error(row + "empty (give at least one token, e.g. bos)");
    const int64_t total = static_cast<int64_t>(p.size()) + o.max_new_tokens;
    if (total > c.max_position_embeddings)
      throw Error(row + std::to_string(p.size()) + " tokens + max_new_tokens " +
                  std::to_string(o.max_new_tokens) + " exceed max_position_embeddings " +
                  std::to_string(c.max_position_embeddings));
    if (c.sliding_window > 0 && total > c.sliding_window)
      throw Error(row + std::to_string(total) + " tokens exceed config.json's sliding_window " +
                  std::to_string(c.sliding_window) +
                  ", and sliding-window attention is not "
                  "implemented");
    for (int64_t id : p)
      if (id < 0 || id >= c.vocab_size)
        throw Error(row + "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(c.vocab_size) + ")");
    L = std::max<int64_t>(L, static_cast<int64_t>(p.size()));
  }

  const bool was_training = model.is_training();
  model.eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor& w = model.embed_tokens->weight;
  const torch::Device device = w.device();
  const auto ids_cpu = torch::TensorOptions().dtype(torch::kLong);

  // Left-padded prompts [B, L], the real positions, and each row's rotary positions.
  const int64_t capacity = L + o.max_new_tokens;
  torch::Tensor tokens = torch::zeros({B, L}, ids_cpu);  // padding: id 0, masked
  torch::Tensor key_valid = torch::ones({B, capacity}, ids_cpu.dtype(torch::kBool));
  std::vector<int64_t> next_position(B);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[b];
    const int64_t n = static_cast<int64_t>(p.size());
    tokens[b].narrow(0, L - n, n).copy_(torch::tensor(p, ids_cpu));
    key_valid[b].narrow(0, 0, L - n).fill_(false);
    next_position[b] = n;
  }
  torch::Tensor positions = (key_valid.narrow(1, 0, L).to(torch::kLong).cumsum(1) - 1).clamp_min(0);
  key_valid = key_valid.to(device);

  std::vector<LayerCache> caches(model.layers.size());
  const int64_t kv_heads = c.num_key_value_heads, D = c.resolved_head_dim();
  for (auto& cache : caches) {
    cache.k = torch::zeros({B, kv_heads, capacity, D}, w.options());
    cache.v = torch::zeros({B, kv_heads, capacity, D}, w.options());
  }
  const torch::Tensor inv_freq = llama_rope_inv_freq(c).to(device);
  at::Generator generator =
      o.generator ? *o.generator : at::make_generator<at::CPUGeneratorImpl>(o.seed);

  GenerateOutput out;
  out.tokens.resize(B);
  std::vector<bool> finished(B, false);
  std::vector<torch::Tensor> columns;
  auto t0 = std::chrono::steady_clock::now();
  torch::Tensor logits =
      step(model, caches, tokens.to(device), positions.to(device), 0, key_valid, inv_freq);
  int64_t cached = L;
  std::chrono::steady_clock::time_point decode_start;
  for (int64_t s = 0; s < o.max_new_tokens; ++s) {
    torch::Tensor next = choose_next_tokens(logits, o, generator);  // [B] on the CPU
    if (s == 0) {
      out.prefill_seconds = seconds_since(t0);
      decode_start = std::chrono::steady_clock::now();
    }
    // A stopped row shows pad_token_id but goes on reading a real token (id 0; its outputs are
    // not read), so pad_token_id need not be in the vocabulary.
    torch::Tensor feed = next.clone();
    auto n = next.accessor<int64_t, 1>();
    auto f = feed.accessor<int64_t, 1>();
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (finished[b]) {
        n[b] = o.pad_token_id;
        f[b] = 0;
        continue;
      }
      out.tokens[b].push_back(n[b]);
      if (std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), n[b]) != o.eos_token_ids.end())
        finished[b] = true;
      all_done = all_done && finished[b];
    }
    columns.push_back(next);
    out.steps = s + 1;
    if (all_done || s + 1 == o.max_new_tokens) break;
    torch::Tensor pos = torch::tensor(next_position, ids_cpu).view({B, 1});
    for (auto& p : next_position) ++p;
    logits = step(model, caches, feed.view({B, 1}).to(device), pos.to(device), cached, key_valid,
                  inv_freq);
    ++cached;
    if (o.on_step) o.on_step(s + 2);
  }
  out.decode_seconds = out.steps > 1 ? seconds_since(decode_start) : 0;
  out.decode_tokens_per_second =
      out.decode_seconds > 0 ? static_cast<double>(B * (out.steps - 1)) / out.decode_seconds : 0;
  out.ids = torch::stack(columns, 1);
  if (was_training) model.train();
  return out;
}

}  // namespace fabric::models
