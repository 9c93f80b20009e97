#include "fabric/models/generate.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "fabric/core/error.h"

namespace fabric::models {

namespace {

// The sampling options, for generate() and choose_next_tokens() alike (a NaN temperature reached
// multinomial's "probability tensor contains inf, nan" with LibTorch's stack; a negative one
// sampled the least likely tokens).
void check_sampling(const GenerateOptions& o, const std::string& name) {
  if (!(o.temperature >= 0) || std::isinf(o.temperature))
    throw Error(name + ": temperature " + std::to_string(o.temperature) +
                " must be 0 (greedy) or a finite positive number");
  if (o.top_k < 0) throw Error(name + ": top_k " + std::to_string(o.top_k) + " must be >= 0");
  if (!(o.top_p > 0 && o.top_p <= 1))
    throw Error(name + ": top_p " + std::to_string(o.top_p) + " must be in (0, 1]");
}

}  // namespace

torch::Tensor choose_next_tokens(const torch::Tensor& logits, const GenerateOptions& o,
                                 at::Generator& generator) {
  check_sampling(o, "choose_next_tokens");
  if (o.temperature > 0 && generator.defined() && !generator.device().is_cpu())
    throw Error("choose_next_tokens: the generator is a " + generator.device().str() +
                " one; sampling runs on the CPU: give a CPU generator (or none)");
  torch::Tensor l = logits.detach().to(torch::kCPU, torch::kFloat);
  if (o.temperature == 0) return l.argmax(-1);
  // Shifted so each row's largest is 0, then scaled by 1 / temperature held below float's
  // largest: a tiny temperature (1e-300 is 0 as a float) gives 0 and -inf, i.e. greedy, not
  // inf - inf or 0 / 0.
  l = (l - l.amax(-1, /*keepdim=*/true)) * std::min(1.0 / o.temperature, 1e30);
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

namespace decode {

namespace {

// Attention of one new position per row: q [B, heads, 1, D] over the cached keys and values
// [B, kv_heads, S, D], `blocked` [B, 1, 1, S] true where a row may not attend, in float32 (products
// of the model's dtype exact, as a fused kernel's float32 accumulation; autocast off), the result
// in q's dtype. Not SDPA: for a masked query on CUDA it picks cuDNN, which builds a graph for every
// key length S, i.e. every decode step: 4.6 ms of host time per layer and step on an H200, 18
// tokens/s for a 1B Llama (docs/benchmarks.md).
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The step's masks: query t (at cache index cached + t) sees key s when s is a real token of its
// row and s <= cached + t; every query also sees itself, so a padding query is never fully masked
// (its output is never read, and it keeps NaNs out of the cache).
Step make_step(torch::Tensor tokens, torch::Tensor positions, int64_t cached,
               const torch::Tensor& key_valid) {
  Step s;
  const int64_t B = tokens.size(0), T = tokens.size(1), S = cached + T;
  const auto options = torch::TensorOptions().dtype(torch::kLong).device(tokens.device());
  const torch::Tensor s_index = torch::arange(S, options).view({1, S});
  const torch::Tensor t_index = torch::arange(cached, S, options).view({T, 1});
  const torch::Tensor causal = s_index <= t_index;  // [T, S]
  s.mask = key_valid.narrow(1, 0, S)
               .view({B, 1, 1, S})
               .logical_and(causal.view({1, 1, T, S}))
               .logical_or((s_index == t_index).view({1, 1, T, S}));
  if (T == 1) s.blocked = s.mask.logical_not();
  s.tokens = std::move(tokens);
  s.positions = std::move(positions);
  s.cached = cached;
  return s;
}

}  // namespace

torch::Tensor Step::attend(LayerCache& cache, const torch::Tensor& q, const torch::Tensor& k,
                           const torch::Tensor& v) const {
  const int64_t T = q.size(2), S = cached + T;
  cache.k.narrow(2, cached, T).copy_(k);
  cache.v.narrow(2, cached, T).copy_(v);
  const torch::Tensor keys = cache.k.narrow(2, 0, S), values = cache.v.narrow(2, 0, S);
  if (T == 1) return decode_attention(q, keys, values, blocked);
  return at::scaled_dot_product_attention(q, keys, values, mask, /*dropout_p=*/0.0,
                                          /*is_causal=*/false, /*scale=*/std::nullopt,
                                          /*enable_gqa=*/q.size(1) != k.size(1));
}

namespace {

// Eval mode and no gradients for the scope; the module's mode restored after it.
class EvalScope {
 public:
  explicit EvalScope(torch::nn::Module& m) : module_(m), was_training_(m.is_training()) {
    module_.eval();
  }
  ~EvalScope() {
    if (was_training_) module_.train();
  }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
  torch::NoGradGuard no_grad_;
};

}  // namespace

void check_parallelism(bool sequence_parallel, bool context_parallel) {
  if (sequence_parallel)
    throw Error(
        "generate: a model under sequence parallelism is not supported (a step of one position "
        "cannot be split over the tensor-parallel ranks); set "
        "fabric.model_parallel.sequence_parallel=false or run its forward per step");
  if (context_parallel)
    throw Error("generate: a context-parallel model is not supported; generate without it");
}

GenerateOutput generate(torch::nn::Module& model, const Decoder& d,
                        const std::vector<std::vector<int64_t>>& prompts,
                        const GenerateOptions& o) {
  const std::string name = "generate";
  if (prompts.empty()) throw Error(name + ": no prompts");
  if (o.max_new_tokens < 1)
    throw Error(name + ": max_new_tokens " + std::to_string(o.max_new_tokens) +
                " must be at least 1");
  check_sampling(o, name);
  const int64_t B = static_cast<int64_t>(prompts.size());
  int64_t L = 0;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& p = prompts[b];
    const std::string row = name + ": prompt " + std::to_string(b) + ": ";
    if (p.empty()) throw Error(row + "empty (give at least one token, e.g. bos)");
    const int64_t total = static_cast<int64_t>(p.size()) + o.max_new_tokens;
    if (total > d.max_positions)
      throw Error(row + std::to_string(p.size()) + " tokens + max_new_tokens " +
                  std::to_string(o.max_new_tokens) + " exceed " + d.positions_key + " " +
                  std::to_string(d.max_positions));
    if (d.sliding_window > 0 && total > d.sliding_window)
      throw Error(row + std::to_string(total) + " tokens exceed config.json's sliding_window " +
                  std::to_string(d.sliding_window) +
                  ", and sliding-window attention is not implemented");
    for (int64_t id : p)
      if (id < 0 || id >= d.vocab_size)
        throw Error(row + "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(d.vocab_size) + ")");
    L = std::max<int64_t>(L, static_cast<int64_t>(p.size()));
  }

  const EvalScope eval(model);
  const torch::Device device = d.options.device();
  const auto ids_cpu = torch::TensorOptions().dtype(torch::kLong);
  // Left-padded prompts [B, L], the real positions, and each row's positions.
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

  std::vector<LayerCache> caches(d.layers);
  for (auto& cache : caches) {
    cache.k = torch::zeros({B, d.kv_heads, capacity, d.head_dim}, d.options);
    cache.v = torch::zeros({B, d.kv_heads, capacity, d.head_dim}, d.options);
  }
  at::Generator generator =
      o.generator ? *o.generator : at::make_generator<at::CPUGeneratorImpl>(o.seed);

  GenerateOutput out;
  out.tokens.resize(B);
  std::vector<bool> finished(B, false);
  std::vector<torch::Tensor> columns;
  auto t0 = std::chrono::steady_clock::now();
  torch::Tensor logits =
      d.forward(make_step(tokens.to(device), positions.to(device), 0, key_valid), caches);
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
    logits = d.forward(make_step(feed.view({B, 1}).to(device), pos.to(device), cached, key_valid),
                       caches);
    ++cached;
    if (o.on_step) o.on_step(s + 2);
  }
  out.decode_seconds = out.steps > 1 ? seconds_since(decode_start) : 0;
  out.decode_tokens_per_second =
      out.decode_seconds > 0 ? static_cast<double>(B * (out.steps - 1)) / out.decode_seconds : 0;
  out.ids = torch::stack(columns, 1);
  return out;
}

}  // namespace decode

}  // namespace fabric::models
