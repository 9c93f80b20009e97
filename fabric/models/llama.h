// fabric::models::Llama: the Llama family of decoder-only language models (Llama 2/3, Qwen2,
// Mistral: one architecture told apart by config flags) in LibTorch.
//
// Pre-norm blocks (RMSNorm → causal grouped-query self-attention with rotary positions →
// residual; RMSNorm → SwiGLU MLP → residual), attention through at::scaled_dot_product_attention,
// an output layer of its own (lm_head) or tied to the token embedding (tie_word_embeddings). Rotary
// embeddings rotate each head's halves (Hugging Face's rotate_half convention, not interleaved
// pairs), with the "llama3" frequency scaling when the config asks for it.
//
// Parameter names are Hugging Face's (model.embed_tokens.weight,
// model.layers.0.self_attn.q_proj.weight, model.layers.0.mlp.gate_proj.weight, model.norm.weight,
// lm_head.weight; no lm_head.weight when tied), so a Hugging Face checkpoint loads by name
// (fabric/hf/llama.h reads the folder).
//
// Each block is a `LlamaDecoderLayer` module: name it for fsdp units (fabric.fsdp.wrap_modules:
// LlamaDecoderLayer) and run it under fabric::checkpoint_activations for activation checkpointing.
//
// Tensor parallelism: the Linear layers and the token embedding are fabric::nn's drop-ins;
// tensor_parallel_plan() splits the attention by whole heads (q by query heads, k and v by
// key/value heads), the MLP, the vocabulary of the embedding and of an untied lm_head (forward
// gathers the logits whole; loss computes the cross-entropy from each rank's V / tp of them).
// Sequence parallelism (fabric.model_parallel.sequence_parallel): between the split layers the
// residual stream holds T / tp positions per rank; the RMSNorms' gradients are summed over the
// ranks; sequences are padded to a multiple of tp inside forward.
//
// Context parallelism (set_context_parallel): each rank of a cp group runs the model on its
// load-balanced share of every sequence, the rotary embeddings at the tokens' global positions and
// the attention over the whole sequence by fabric::nn::ring_attention.
//
//   fabric::models::Llama model(fabric::hf::read_llama_config("folder/config.json"));
//   fabric::hf::load_llama_weights(*model, "folder");
//   torch::Tensor logits = model->forward(tokens);        // int64 [B, T] → [B, T, vocab_size]
#ifndef FABRIC_MODELS_LLAMA_H_
#define FABRIC_MODELS_LLAMA_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/nn/fp8_layers.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::models {

struct LlamaConfig {
  std::string model_type = "llama";  // llama, qwen2 or mistral (informational)
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // grouped-query attention when fewer than the heads
  int64_t head_dim = 0;              // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  // Rotary frequency scaling: "default" (none) or "llama3" (with the four values below).
  std::string rope_type = "default";
  double rope_factor = 1.0, rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;
  int64_t max_position_embeddings = 2048;
  bool attention_bias = false;  // biases on q_proj, k_proj, v_proj and o_proj (Llama's flag)
  bool qkv_bias = false;        // biases on q_proj, k_proj and v_proj only (Qwen2)
  bool tie_word_embeddings = false;
  // Sliding-window attention is not implemented: forward refuses sequences longer than this
  // (0: no window).
  int64_t sliding_window = 0;
  std::string torch_dtype = "float32";  // the checkpoint's dtype; parameters are float32 here
  // Fabric's, not config.json's (examples' model.fused_layer_norm): the RMSNorms, with the
  // residual add before the second of each layer, as fused CUDA kernels with 16-bit outputs
  // where they apply (fused_layer_norm.h: CUDA, 16-bit autocast, not under sequence
  // parallelism); elsewhere, and when false, the ATen formula.
  bool fused_norm = true;
  // Fabric's too (model.fused_elementwise): the rotary embedding of queries and keys and the MLP's
  // silu(gate) · up as fused CUDA kernels where they apply (fused_llama_ops.h: CUDA, 16-bit);
  // elsewhere, and when false, ATen's operators.
  bool fused_elementwise = true;

  int64_t resolved_head_dim() const {
    return head_dim > 0 ? head_dim : hidden_size / num_attention_heads;
  }
  // fabric::Error naming the first inconsistent field (heads not dividing, sizes < 1).
  void validate() const;
  int64_t parameters() const;
  // Floating-point operations per token of a training step (forward + backward) over sequences
  // of `sequence` tokens, counted as for the GPT (PaLM's appendix B): 6 · N + 12 · layers ·
  // heads · head_dim · sequence, N the parameters without the input embedding's lookup table
  // (the output layer's matrix counted, once when tied). For MFU.
  double flops_per_token(int64_t sequence) const;
};

// The process group of context parallelism (fabric/models/context_parallel.h; declared only, so
// that this header needs no c10d).
struct ContextParallelGroup;

// x · rsqrt(mean(x²) + eps) · weight over the last dimension, computed in float32.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& weight);  // another weight
  double eps() const { return eps_; }
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// A Linear as the Llama initializes one: weight ~ N(0, 0.02), the bias (when `bias`) zero.
fabric::nn::Linear llama_linear(int64_t in, int64_t out, bool bias);

// norm on x, which under sequence parallelism (shard's) holds this rank's positions: the
// weight's gradient then summed over the tp ranks in backward
// (fabric::nn::sequence_parallel_weight); norm->forward(x) otherwise.
torch::Tensor llama_rms_norm(RMSNorm& norm, const torch::Tensor& x,
                             const std::optional<fabric::nn::TensorParallelShard>& shard);

// The model's last RMSNorm (model.norm) on the whole positions: with config.fused_norm the fused
// kernel's 16-bit output where it applies, else norm->forward(x).
torch::Tensor llama_final_norm(const LlamaConfig& config, RMSNorm& norm, const torch::Tensor& x);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& c);
  // x [B, T, hidden] (positions 0 .. T-1; under context parallelism this rank's T of the
  // sequence's T · cp, at positions cp_rank_positions(T · cp, cp, rank)) → [B, T, hidden].
  torch::Tensor forward(const torch::Tensor& x);
  // forward(produce(nullptr)) under autocast, with q's, k's and v's one float8 input cast made by
  // `produce` when they take one (fabric::nn::shared_input_forward; like: produce's input, the
  // norm's float32 x [B, T, hidden]).
  torch::Tensor forward(const torch::Tensor& like, const fabric::nn::Fp8Producer& produce);
  fabric::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Context parallelism (LlamaImpl::set_context_parallel): the rotary angles at the global
  // positions and attention over the whole sequence by fabric::nn::ring_attention over this group
  // (grouped-query heads as they are); null: SDPA on the tokens given, at positions 0 .. T-1.
  std::shared_ptr<const ContextParallelGroup> context_parallel;

 private:
  // The attention from q, k and v's projections of x (the norm's output, or its input `like`:
  // read for its batch size, device and dtype).
  torch::Tensor attend(const std::vector<torch::Tensor>& qkv, const torch::Tensor& x);
  int64_t heads_, kv_heads_, head_dim_;
  bool fused_elementwise_;  // LlamaConfig::fused_elementwise
  torch::Tensor inv_freq_;  // llama_rope_inv_freq (not a buffer: checkpoints do not hold it)
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // down(silu(gate(x)) · up(x))
  // forward(produce(nullptr)), gate's and up's float8 input cast made by `produce` when they take
  // one (fabric::nn::swiglu_mlp; like as attention's).
  torch::Tensor forward(const torch::Tensor& like, const fabric::nn::Fp8Producer& produce);
  fabric::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  bool fused_elementwise_;  // LlamaConfig::fused_elementwise
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const LlamaConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, hidden] → [B, T, hidden]
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMLP mlp{nullptr};

 private:
  bool fused_norm_;  // LlamaConfig::fused_norm
};
TORCH_MODULE(LlamaDecoderLayer);

class LlamaImpl : public torch::nn::Module, public fabric::nn::TensorParallelPlanned {
 public:
  // Initialized as Hugging Face initializes a new model: Linear and Embedding weights ~ N(0,
  // 0.02), biases 0, norm weights 1. fabric::Error for an inconsistent config (validate()).
  explicit LlamaImpl(const LlamaConfig& c);
  fabric::nn::TensorParallelPlan tensor_parallel_plan() const override;
  // Runs a block (e.g. through fabric::checkpoint_activations); null: block->forward.
  using RunBlock = std::function<torch::Tensor(LlamaDecoderLayer&, const torch::Tensor&)>;
  // tokens: int64 [B, T] (T <= max_position_embeddings, and <= sliding_window when set; otherwise
  // fabric::Error) → float logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& tokens, const RunBlock& run_block = nullptr);
  // Mean next-token cross-entropy against targets [B, T] (fused on GPUs where it applies).
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                     const RunBlock& run_block = nullptr);
  // model.norm's output [B, T, hidden] (the output layer's input).
  torch::Tensor hidden(const torch::Tensor& tokens, const RunBlock& run_block = nullptr);
  // Context parallelism (issue 71) over `group` (cp ranks; null: off), as GPTImpl's: forward,
  // loss and hidden then take this rank's load-balanced share of each sequence, tokens [B, T / cp]
  // in fabric::nn::cp_rank_positions(T, cp, rank) order (chunks rank and 2·cp − 1 − rank of 2·cp),
  // with every layer's rotary embeddings at the tokens' global positions and causal attention over
  // the whole sequence (fabric::nn::ring_attention, key/value heads fewer than the query heads
  // kept so); everything else is per position. loss() is then the mean over this rank's tokens:
  // its mean over the group is the whole sequence's, and so are the gradients averaged over the
  // group. forward refuses (fabric::Error) a T that 2·cp does not divide and a T longer than
  // max_position_embeddings or sliding_window, naming T and cp. fabric::Error here: a model split
  // under sequence parallelism.
  void set_context_parallel(fabric::nn::ProcessGroupPtr group);
  // The output layer's weight [vocab, hidden]: lm_head's, or the embedding's when tied.
  const torch::Tensor& output_weight() const;
  const LlamaConfig& config() const { return config_; }

  fabric::nn::Embedding embed_tokens{nullptr};  // model.embed_tokens
  std::vector<LlamaDecoderLayer> layers;        // model.layers.0, model.layers.1, ...
  RMSNorm norm{nullptr};                        // model.norm
  fabric::nn::Linear lm_head{nullptr};          // null when tie_word_embeddings

 private:
  // whole false under sequence parallelism: this rank's positions of the padded sequence.
  torch::Tensor hidden(const torch::Tensor& tokens, const RunBlock& run_block, bool whole);
  // This rank's [B, T, V / tp] logits of an lm_head split by vocabulary.
  torch::Tensor split_head_logits(const torch::Tensor& tokens, const RunBlock& run_block);
  LlamaConfig config_;
};
TORCH_MODULE(Llama);

// The pieces of LlamaImpl::loss around its layers, on the modules given (the model's own, or those
// a pipeline stage holds: fabric/models/pipeline_stages.h). llama_check_tokens: fabric::Error for
// token ids that are not [B, T] or longer than the config allows. llama_head_loss: the mean
// next-token cross-entropy from model.norm's output `h` (whole positions) through lm_head, or the
// embedding when lm_head is null (tied); vocabulary-parallel where either is split over tp.
void llama_check_tokens(const LlamaConfig& c, const torch::Tensor& tokens);
torch::Tensor llama_head_loss(fabric::nn::Embedding& embed_tokens, fabric::nn::Linear& lm_head,
                              const torch::Tensor& h, const torch::Tensor& targets);

// The rotary inverse frequencies [head_dim / 2] (float32) of config `c`, llama3 scaling applied.
torch::Tensor llama_rope_inv_freq(const LlamaConfig& c);

// The Llama's tensor-parallel plan: q_proj column by query heads, k_proj and v_proj column by
// key/value heads (a tp that does not divide num_key_value_heads is refused, naming it), o_proj
// row by heads, gate_proj and up_proj column, down_proj row, model.embed_tokens vocab, lm_head
// (untied) column by vocabulary.
fabric::nn::TensorParallelPlan llama_tensor_parallel_plan(const LlamaConfig& c);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_LLAMA_H_
