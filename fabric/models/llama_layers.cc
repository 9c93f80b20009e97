// The Llama's layers (fabric/models/llama.h): RMSNorm, attention with rotary embeddings and
// grouped-query heads, the SwiGLU MLP and the decoder layer; the model around them is llama.cc.
#include <ATen/autocast_mode.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>
#include <torch/types.h>

#include <optional>
#include <vector>

#include "fabric/models/context_parallel.h"
#include "fabric/models/fused_layer_norm.h"
#include "fabric/models/fused_llama_ops.h"
#include "fabric/models/llama.h"
#include "fabric/nn/ring_attention.h"
#include "fabric/nn/ring_attention_dist.h"

namespace fabric::models {

fabric::nn::Linear llama_linear(int64_t in, int64_t out, bool bias) {
  fabric::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(l->weight, 0.0, 0.02);
  if (bias) l->bias.zero_();
  return l;
}

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return forward(x, weight); }

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x, const torch::Tensor& w) {
  return rms_norm_aten(x, w, eps_);
}

torch::Tensor llama_final_norm(const LlamaConfig& config, RMSNorm& norm, const torch::Tensor& x) {
  return config.fused_norm ? rms_norm_16(x, norm->weight, norm->eps()) : norm->forward(x);
}

torch::Tensor llama_rms_norm(RMSNorm& norm, const torch::Tensor& x,
                             const std::optional<fabric::nn::TensorParallelShard>& shard) {
  if (!shard || !shard->sequence_parallel) return norm->forward(x);
  return norm->forward(x, fabric::nn::sequence_parallel_weight(norm->weight, shard));
}

namespace {

torch::Tensor swiglu_aten(const torch::Tensor& gate, const torch::Tensor& up) {
  return torch::silu(gate) * up;
}

}  // namespace

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& c)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_dim_(c.resolved_head_dim()),
      fused_elementwise_(c.fused_elementwise),
      inv_freq_(llama_rope_inv_freq(c)) {
  const bool qkv_bias = c.attention_bias || c.qkv_bias;
  q_proj = register_module("q_proj", llama_linear(c.hidden_size, heads_ * head_dim_, qkv_bias));
  k_proj = register_module("k_proj", llama_linear(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
  v_proj = register_module("v_proj", llama_linear(c.hidden_size, kv_heads_ * head_dim_, qkv_bias));
  o_proj =
      register_module("o_proj", llama_linear(heads_ * head_dim_, c.hidden_size, c.attention_bias));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  // (Under fp8-mixed one cast of x for the three: fabric::nn::shared_input_forward.)
  return attend(fabric::nn::shared_input_forward({q_proj.get(), k_proj.get(), v_proj.get()}, x), x);
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& like,
                                          const fabric::nn::Fp8Producer& produce) {
  return attend(
      fabric::nn::shared_input_forward({q_proj.get(), k_proj.get(), v_proj.get()}, like, produce),
      like);
}

torch::Tensor LlamaAttentionImpl::attend(const std::vector<torch::Tensor>& qkv,
                                         const torch::Tensor& x) {
  // Under sequence parallelism x holds this rank's T / tp positions and the column layers gather
  // the whole sequence: T is theirs.
  const torch::Tensor &q_out = qkv[0], &k_out = qkv[1], &v_out = qkv[2];
  const int64_t B = x.size(0), T = q_out.size(1);
  const torch::Device device = x.device();
  // In the residual stream's dtype: float32 under autocast (the RMSNorm's output is 16-bit when
  // the norm is fused), else x's.
  const auto rope_type =
      at::autocast::is_autocast_enabled(device.type()) ? torch::kFloat : x.scalar_type();
  // Rotary angles [T, D]: position · frequency, each frequency twice (for the two halves). Under
  // context parallelism the tokens' global positions (two chunks, not contiguous), as float32
  // integers: the angles are those of the whole sequence's rows bit for bit.
  const torch::Tensor positions =
      context_parallel
          ? context_parallel_positions(*context_parallel, T, device).to(torch::kFloat)
          : torch::arange(T, torch::TensorOptions().dtype(torch::kFloat).device(device));
  const torch::Tensor half = torch::outer(positions, inv_freq_.to(device));
  const torch::Tensor angles = torch::cat({half, half}, -1);
  const torch::Tensor cos = angles.cos().to(rope_type), sin = angles.sin().to(rope_type);
  // This rank's heads under tensor parallelism (the whole model's otherwise).
  const int64_t heads = fabric::nn::local_heads(q_proj, heads_);
  const int64_t kv_heads = fabric::nn::local_heads(k_proj, kv_heads_);
  auto split = [&](const torch::Tensor& t, int64_t n) {
    return t.view({B, T, n, head_dim_}).transpose(1, 2);  // [B, n, T, D]
  };
  // t · cos + rotate_half(t) · sin (one kernel each way where fused_llama_ops.h applies).
  auto rotate = [&](const torch::Tensor& t) {
    return fused_elementwise_ ? rotary_16(t, cos, sin) : t * cos + rotate_half(t) * sin;
  };
  const torch::Tensor q = rotate(split(q_out, heads));
  const torch::Tensor k = rotate(split(k_out, kv_heads));
  const torch::Tensor v = split(v_out, kv_heads);
  // Grouped-query attention: query head h reads key/value head h / (heads / kv_heads), in the ring
  // too (only the kv_heads travel).
  torch::Tensor y =
      context_parallel
          ? fabric::nn::ring_attention(q.contiguous(), k.contiguous(), v.contiguous(),
                                       context_parallel->group, /*causal=*/true)
          : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                             /*is_causal=*/true, /*scale=*/std::nullopt,
                                             /*enable_gqa=*/heads != kv_heads);
  y = y.transpose(1, 2).contiguous().view({B, T, heads * head_dim_});
  return o_proj->forward(y);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& c) : fused_elementwise_(c.fused_elementwise) {
  gate_proj = register_module("gate_proj", llama_linear(c.hidden_size, c.intermediate_size, false));
  up_proj = register_module("up_proj", llama_linear(c.hidden_size, c.intermediate_size, false));
  down_proj = register_module("down_proj", llama_linear(c.intermediate_size, c.hidden_size, false));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) {
  // (Under fp8-mixed one node: x cast once for gate and up, the SwiGLU computed in the casts.)
  return fabric::nn::swiglu_mlp(*gate_proj, *up_proj, *down_proj, x,
                                fused_elementwise_ ? swiglu_16 : swiglu_aten);
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& like,
                                    const fabric::nn::Fp8Producer& produce) {
  return fabric::nn::swiglu_mlp(*gate_proj, *up_proj, *down_proj, like, produce,
                                fused_elementwise_ ? swiglu_16 : swiglu_aten);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& c) : fused_norm_(c.fused_norm) {
  self_attn = register_module("self_attn", LlamaAttention(c));
  mlp = register_module("mlp", LlamaMLP(c));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x) {
  const auto& shard = self_attn->q_proj->parallel();
  if (fused_norm_ && (!shard || !shard->sequence_parallel) &&
      rms_norm_applies(x, input_layernorm->weight)) {
    // The first RMSNorm with a 16-bit output (x through its node: backward adds x's residual
    // gradient in its kernel); the residual add and the second in one kernel (fused_layer_norm.h).
    // Under fp8-mixed with delayed scaling each writes its output as the float8 input that q, k
    // and v, and gate and up, share instead (handed the cast by fabric::nn; the same values): it
    // is never written in 16 bits and read again. Under tensorwise, each takes its output's amax
    // as it writes it, which the layers' one cast reads.
    const torch::Tensor &w1 = input_layernorm->weight, &w2 = post_attention_layernorm->weight;
    const double eps1 = input_layernorm->eps(), eps2 = post_attention_layernorm->eps();
    torch::Tensor x1, h;
    auto norm1 = [&](fabric::nn::Fp8InputCast* cast) {
      auto [kept, y] = cast ? keep_rms_norm_fp8(x, w1, eps1, take_fp8_target(*cast))
                            : keep_rms_norm_16(x, w1, eps1);
      x1 = kept;
      return y;
    };
    const torch::Tensor a = self_attn->forward(x, norm1);
    auto norm2 = [&](fabric::nn::Fp8InputCast* cast) {
      auto [sum, y] = cast && add_rms_norm_applies(x1, a, w2)
                          ? add_rms_norm_fp8(x1, a, w2, eps2, take_fp8_target(*cast))
                          : add_rms_norm_16(x1, a, w2, eps2);
      h = sum;
      return y;
    };
    const torch::Tensor m = mlp->forward(x, norm2);
    return h + m;
  }
  const torch::Tensor h = x + self_attn->forward(llama_rms_norm(input_layernorm, x, shard));
  return h + mlp->forward(llama_rms_norm(post_attention_layernorm, h, shard));
}

}  // namespace fabric::models
