#include "fabric/models/gpt.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <sstream>

#include "fabric/core/error.h"
#include "fabric/models/context_parallel.h"
#include "fabric/models/fused_layer_norm.h"
#include "fabric/nn/parallel_rng.h"
#include "fabric/nn/ring_attention_dist.h"

namespace fabric::models {

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  if (name == "gpt2") return c;
  if (name == "gpt2-medium") {
    c.n_layer = 24;
    c.n_head = 16;
    c.n_embd = 1024;
    return c;
  }
  if (name == "gpt2-large") {
    c.n_layer = 36;
    c.n_head = 20;
    c.n_embd = 1280;
    return c;
  }
  if (name == "gpt2-xl") {
    c.n_layer = 48;
    c.n_head = 25;
    c.n_embd = 1600;
    return c;
  }
  if (name == "tiny") {
    c.vocab_size = 256;
    c.block_size = 256;
    c.n_layer = 4;
    c.n_head = 4;
    c.n_embd = 128;
    return c;
  }
  throw Error("model.preset: '" + name +
              "' is not a GPT preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, tiny)");
}

int64_t GPTConfig::parameters() const {
  const int64_t C = n_embd, b = bias ? 1 : 0;
  const int64_t per_block = 2 * C +                  // ln_1
                            3 * C * C + b * 3 * C +  // c_attn
                            C * C + b * C +          // attn.c_proj
                            2 * C +                  // ln_2
                            4 * C * C + b * 4 * C +  // c_fc
                            4 * C * C + b * C;       // mlp.c_proj
  return vocab_size * C + block_size * C + n_layer * per_block + 2 * C;
}

double GPTConfig::flops_per_token() const {
  const double n = static_cast<double>(parameters() - block_size * n_embd);
  return 6 * n + 12.0 * static_cast<double>(n_layer * n_embd * block_size);
}

namespace {

// Whether this layer's output is a piece that differs between the ranks of its tp group (its
// heads' outputs; its positions under sequence parallelism, `positions`): dropout there draws
// from the rank's own stream (fabric/nn/parallel_rng.h).
bool split_across_ranks(const std::optional<fabric::nn::TensorParallelShard>& shard,
                        bool positions) {
  return shard && shard->size > 1 && (!positions || shard->sequence_parallel);
}

// d(x), with this rank's own random stream where x is its piece of the positions.
torch::Tensor dropout(torch::nn::Dropout& d, const torch::Tensor& x,
                      const std::optional<fabric::nn::TensorParallelShard>& shard) {
  if (!d->is_training() || d->options.p() == 0.0 || !split_across_ranks(shard, true))
    return d->forward(x);
  const fabric::nn::RankRandomScope own(x.device(), shard->rank);
  return d->forward(x);
}

void normal(torch::Tensor& w, double std) {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(w, 0.0, std);
}

fabric::nn::Linear linear(int64_t in, int64_t out, bool bias, double std) {
  fabric::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  normal(l->weight, std);
  if (bias) {
    torch::NoGradGuard no_grad;
    l->bias.zero_();
  }
  return l;
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c) : dropout_(c.dropout) {
  if (c.n_embd % c.n_head != 0)
    throw Error("model.n_embd: " + std::to_string(c.n_embd) +
                " is not a multiple of model.n_head " + std::to_string(c.n_head));
  head_size_ = c.n_embd / c.n_head;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  c_attn = register_module("c_attn", linear(c.n_embd, 3 * c.n_embd, c.bias, 0.02));
  c_proj = register_module("c_proj", linear(c.n_embd, c.n_embd, c.bias, residual_std));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  // ATen's linear folds a contiguous [B, T, C] input into one GEMM with the bias added inside it
  // (cuBLASLt's epilogue on GPUs); torch::nn::Linear's forward ran matmul and a separate bias add
  // on 3-D inputs, 10% slower on an H100 (docs/benchmarks.md, "GPT-2"). fabric::nn::Linear uses it.
  return attend(c_attn->forward(x), x.device());
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& like,
                                               const fabric::nn::Fp8Producer& produce) {
  return attend(fabric::nn::produced_forward(*c_attn, like, produce), like.device());
}

torch::Tensor CausalSelfAttentionImpl::attend(const torch::Tensor& qkv_all,
                                              const torch::Device& device) {
  // C: this rank's q (k, v) width: n_embd, or its heads' share under tensor parallelism; T from
  // c_attn's output (under sequence parallelism x holds T / tp positions, c_attn gathers them).
  const int64_t B = qkv_all.size(0), T = qkv_all.size(1), C = c_attn->weight.size(0) / 3;
  const auto qkv = qkv_all.split(C, 2);
  auto heads = [&](const torch::Tensor& t) {
    return t.view({B, T, C / head_size_, head_size_}).transpose(1, 2);  // [B, nh, T, hs]
  };
  const double p = is_training() ? dropout_ : 0.0;
  const auto& shard = c_proj->parallel();
  std::optional<fabric::nn::RankRandomScope> own;  // this rank's heads: its own masks
  if (p > 0.0 && split_across_ranks(shard, false)) own.emplace(device, shard->rank);
  torch::Tensor y =
      context_parallel
          ? fabric::nn::ring_attention(heads(qkv[0]).contiguous(), heads(qkv[1]).contiguous(),
                                       heads(qkv[2]).contiguous(), context_parallel->group,
                                       /*causal=*/true)
          : at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                             /*attn_mask=*/{}, p, /*is_causal=*/true);
  own.reset();
  y = y.transpose(1, 2).contiguous().view({B, T, C});
  return dropout(resid_dropout, c_proj->forward(y), shard);
}

MLPImpl::MLPImpl(const GPTConfig& c) : gelu_(c.gelu) {
  if (gelu_ != "tanh" && gelu_ != "none")
    throw Error("GPTConfig.gelu: '" + gelu_ +
                "' is not a GELU form (tanh: the tanh approximation, none: exact)");
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  c_fc = register_module("c_fc", linear(c.n_embd, 4 * c.n_embd, c.bias, 0.02));
  c_proj = register_module("c_proj", linear(4 * c.n_embd, c.n_embd, c.bias, residual_std));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  // Under fp8-mixed the tanh GELU goes into c_proj's float8 cast and its gradient into c_fc's
  // (fabric::nn::gelu_tanh_mlp; the same values).
  return models::dropout(dropout,
                         gelu_ == "tanh" ? fabric::nn::gelu_tanh_mlp(*c_fc, *c_proj, x)
                                         : c_proj->forward(torch::gelu(c_fc->forward(x), gelu_)),
                         c_proj->parallel());
}

torch::Tensor MLPImpl::forward(const torch::Tensor& like, const fabric::nn::Fp8Producer& produce) {
  if (gelu_ != "tanh") return forward(produce(nullptr));
  return models::dropout(dropout, fabric::nn::gelu_tanh_mlp(*c_fc, *c_proj, like, produce),
                         c_proj->parallel());
}

BlockImpl::BlockImpl(const GPTConfig& c) : fused_layer_norm_(c.fused_layer_norm) {
  const auto ln = torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_epsilon);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(ln));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(ln));
  mlp = register_module("mlp", MLP(c));
}

namespace {

// A LayerNorm whose weights are summed over the tp ranks in backward under sequence parallelism
// (each rank normalizes its own positions); ln->forward otherwise.
torch::Tensor norm(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                   const std::optional<fabric::nn::TensorParallelShard>& shard) {
  if (!shard || !shard->sequence_parallel) return ln->forward(x);
  return torch::layer_norm(
      x, ln->options.normalized_shape(), fabric::nn::sequence_parallel_weight(ln->weight, shard),
      fabric::nn::sequence_parallel_weight(ln->bias, shard), ln->options.eps());
}

}  // namespace

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  if (const auto& shard = attn->c_attn->parallel(); shard && shard->sequence_parallel) {
    const torch::Tensor h = x + attn->forward(norm(ln_1, x, shard));
    return h + mlp->forward(norm(ln_2, h, shard));
  }
  if (fused_layer_norm_ && layer_norm_applies(x, ln_1)) {
    // ln_1 with a 16-bit output (x through its node: backward adds x's residual gradient in its
    // kernel); the residual add and ln_2 in one kernel (fused_layer_norm.h). Under fp8-mixed with
    // delayed scaling each writes its output as the float8 input of c_attn and c_fc instead
    // (handed the cast by fabric::nn::produced_forward; the same values): it is never written
    // in 16 bits and read again. Under tensorwise, each takes its output's amax as it writes it,
    // which the Linear's cast reads.
    torch::Tensor x1, h;
    auto norm1 = [&](fabric::nn::Fp8InputCast* cast) {
      auto [kept, y] =
          cast ? keep_layer_norm_fp8(x, ln_1, take_fp8_target(*cast)) : keep_layer_norm_16(x, ln_1);
      x1 = kept;
      return y;
    };
    const torch::Tensor a = attn->forward(x, norm1);
    auto norm2 = [&](fabric::nn::Fp8InputCast* cast) {
      auto [sum, y] = cast && add_layer_norm_applies(x1, a, ln_2)
                          ? add_layer_norm_fp8(x1, a, ln_2, take_fp8_target(*cast))
                          : add_layer_norm_16(x1, a, ln_2);
      h = sum;
      return y;
    };
    const torch::Tensor m = mlp->forward(x, norm2);
    return h + m;
  }
  const torch::Tensor h = x + attn->forward(ln_1->forward(x));
  return h + mlp->forward(ln_2->forward(h));
}

GPTImpl::GPTImpl(const GPTConfig& c) : config_(c) {
  auto transformer = register_module("transformer", std::make_shared<torch::nn::Module>());
  wte = transformer->register_module("wte", fabric::nn::Embedding(c.vocab_size, c.n_embd));
  wpe = transformer->register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  normal(wte->weight, 0.02);
  normal(wpe->weight, 0.02);
  drop = transformer->register_module("drop", torch::nn::Dropout(c.dropout));
  torch::nn::ModuleList h;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks.push_back(Block(c));
    h->push_back(blocks.back());
  }
  transformer->register_module("h", h);
  ln_f = transformer->register_module(
      "ln_f",
      torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_epsilon)));
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) { return forward(tokens, nullptr); }

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens, const RunBlock& run_block) {
  return fabric::nn::tied_logits(hidden(tokens, run_block), wte);  // tied to the token embedding
}

torch::Tensor GPTImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                            const RunBlock& run_block) {
  return gpt_head_loss(config_, wte, hidden(tokens, run_block), targets);
}

namespace {

void check_tokens(const torch::Tensor& tokens, int64_t block_size) {
  if (tokens.dim() != 2) throw Error("GPT::forward: tokens must be [B, T] token ids");
  if (tokens.size(1) > block_size)
    throw Error("GPT::forward: a sequence of " + std::to_string(tokens.size(1)) +
                " tokens is longer than model.block_size " + std::to_string(block_size));
}

}  // namespace

torch::Tensor gpt_embed(const GPTConfig& c, fabric::nn::Embedding& wte, torch::nn::Embedding& wpe,
                        torch::nn::Dropout& drop, const torch::Tensor& tokens) {
  check_tokens(tokens, c.block_size);
  const torch::Tensor positions = torch::arange(
      tokens.size(1), torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  return drop->forward(wte->forward(tokens) + wpe->forward(positions));
}

torch::Tensor gpt_head_loss(const GPTConfig& c, fabric::nn::Embedding& wte, const torch::Tensor& h,
                            const torch::Tensor& targets) {
  if (const auto& p = wte->parallel()) {
    const torch::Tensor logits =
        torch::linear(fabric::nn::copy_to_parallel(h, p->group), wte->weight);
    return fabric::nn::vocab_parallel_cross_entropy(logits, targets, wte->vocab_start(), p->group);
  }
  return linear_cross_entropy(h, wte->weight, targets, c.fused_loss);
}

torch::Tensor gpt_final_norm(const GPTConfig& c, torch::nn::LayerNorm& ln_f,
                             const torch::Tensor& x) {
  return c.fused_layer_norm ? layer_norm_16(x, ln_f) : ln_f->forward(x);
}

void GPTImpl::set_context_parallel(fabric::nn::ProcessGroupPtr group) {
  if (group && config_.dropout > 0) {
    std::ostringstream p;
    p << config_.dropout;
    throw Error("GPT context parallelism: model.dropout " + p.str() +
                " is not supported (attention dropout does not run in the ring); set it to 0");
  }
  const auto& shard = blocks.empty() ? wte->parallel() : blocks[0]->attn->c_attn->parallel();
  if (group && shard && shard->sequence_parallel)
    throw Error(
        "GPT context parallelism does not compose with sequence parallelism yet; set "
        "fabric.model_parallel.sequence_parallel: false");
  const auto cp =
      group ? std::make_shared<const ContextParallelGroup>(ContextParallelGroup{std::move(group)})
            : nullptr;
  for (Block& block : blocks) block->attn->context_parallel = cp;
}

torch::Tensor GPTImpl::hidden(const torch::Tensor& tokens, const RunBlock& run_block) {
  if (!blocks.empty() && blocks[0]->attn->context_parallel) {
    // This rank's share of each sequence: positions at their global indices (cp_rank_positions).
    const ContextParallelGroup& context = *blocks[0]->attn->context_parallel;
    if (tokens.dim() != 2) throw Error("GPT::forward: tokens must be [B, T] token ids");
    const int64_t cp = context.group->getSize(), T = tokens.size(1) * cp;
    if (T > config_.block_size)
      throw Error("GPT::forward: a sequence of " + std::to_string(T) + " tokens (" +
                  std::to_string(tokens.size(1)) + " on each of " + std::to_string(cp) +
                  " context-parallel ranks) is longer than model.block_size " +
                  std::to_string(config_.block_size));
    const torch::Tensor positions =
        context_parallel_positions(context, tokens.size(1), tokens.device());
    torch::Tensor x = drop->forward(wte->forward(tokens) + wpe->forward(positions));
    for (Block& block : blocks) x = run_block ? run_block(block, x) : block->forward(x);
    return gpt_final_norm(config_, ln_f, x);
  }
  check_tokens(tokens, config_.block_size);
  const int64_t T = tokens.size(1);
  // Sequence parallelism (a plan's): the blocks run on this rank's positions, so the sequence is
  // padded to a multiple of tp (a sample's growing prompt; causal attention keeps the padding
  // out of the real positions) and the output gathered whole for the (vocabulary-parallel) head.
  const auto& shard = blocks.empty() ? wte->parallel() : blocks[0]->attn->c_attn->parallel();
  const bool sequence_parallel = shard && shard->sequence_parallel;
  const int64_t pad = sequence_parallel ? (shard->size - T % shard->size) % shard->size : 0;
  if (T + pad > config_.block_size)
    throw Error("GPT::forward: sequence parallelism pads " + std::to_string(T) + " tokens to " +
                std::to_string(T + pad) + ", more than model.block_size " +
                std::to_string(config_.block_size) + "; make model.block_size a multiple of tp");
  const torch::Tensor ids =
      pad > 0 ? torch::cat({tokens, torch::zeros({tokens.size(0), pad}, tokens.options())}, 1)
              : tokens;
  torch::Tensor x = gpt_embed(config_, wte, wpe, drop, ids);
  if (sequence_parallel) {
    x = fabric::nn::enter_sequence_parallel(x, shard);
    for (Block& block : blocks) x = run_block ? run_block(block, x) : block->forward(x);
    x = fabric::nn::leave_sequence_parallel(norm(ln_f, x, shard), shard);
    return pad > 0 ? x.narrow(1, 0, T) : x;
  }
  for (Block& block : blocks) x = run_block ? run_block(block, x) : block->forward(x);
  return gpt_final_norm(config_, ln_f, x);
}

fabric::nn::TensorParallelPlan GPTImpl::tensor_parallel_plan() const {
  return gpt_tensor_parallel_plan(config_);
}

fabric::nn::TensorParallelPlan gpt_tensor_parallel_plan(const GPTConfig& c) {
  using Style = fabric::nn::TensorParallelStyle;
  const int64_t head_size = c.n_head > 0 ? c.n_embd / c.n_head : 1;
  const char* heads = "attention heads (model.n_head)";
  return {{{"transformer.wte", Style::vocab()},
           {"transformer.h.*.attn.c_attn", Style::column(3).in_units(head_size, heads)},
           {"transformer.h.*.attn.c_proj", Style::row().in_units(head_size, heads)},
           {"transformer.h.*.mlp.c_fc", Style::column()},
           {"transformer.h.*.mlp.c_proj", Style::row()}}};
}

}  // namespace fabric::models
