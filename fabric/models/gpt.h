// fabric::models::GPT: a decoder-only transformer language model (GPT-2's architecture) in
// LibTorch.
//
// Pre-LN blocks (LayerNorm → causal self-attention → residual; LayerNorm → GELU MLP → residual;
// the GELU's tanh approximation by default, GPTConfig::gelu), attention through
// at::scaled_dot_product_attention (FlashAttention / cuDNN / memory-efficient kernels on GPUs, a
// fused kernel on CPU), learned positions, the output projection tied to the token embedding
// (logits = x · wte.weightᵀ: one parameter, counted and updated once), dropout,
// optional biases (the Linear layers'). GPT-2 initialization: every Linear and Embedding
// weight ~ N(0, 0.02), biases 0, and the residual projections (attention's and the MLP's c_proj)
// ~ N(0, 0.02 / sqrt(2 · n_layer)). Parameter names follow nanoGPT's (transformer.wte.weight,
// transformer.h.0.attn.c_attn.weight, ...; no lm_head.weight, which nanoGPT ties to wte's).
//
// Each block is a `Block` module: name it for fsdp units (fabric.fsdp.wrap_modules: Block) and run
// it under fabric::checkpoint_activations for activation checkpointing.
//
// Tensor parallelism: the Linear layers and the token embedding are fabric::nn's drop-ins, so
// fabric::nn::parallelize(*model, model->tensor_parallel_plan(), tp_group) splits the attention
// heads, the MLP and the vocabulary (fabric/nn/tensor_parallel.h); forward and loss then run on
// the rank's slices, the loss without the whole logits.
//
//   fabric::models::GPT model(fabric::models::GPTConfig::preset("tiny"));
//   torch::Tensor logits = model->forward(tokens);          // int64 [B, T] → [B, T, vocab_size]
//   torch::Tensor loss = model->loss(tokens, targets);      // mean cross-entropy, fused on GPUs
#ifndef FABRIC_MODELS_GPT_H_
#define FABRIC_MODELS_GPT_H_

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fabric/models/fused_cross_entropy.h"
#include "fabric/nn/fp8_layers.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::models {

struct GPTConfig {
  int64_t vocab_size = 50304;  // GPT-2's 50257 padded to a multiple of 64 (faster matmuls)
  int64_t block_size = 1024;   // the longest sequence (positions)
  int64_t n_layer = 12, n_head = 12, n_embd = 768;
  double dropout = 0.0;
  bool bias = true;
  // The MLP's GELU: "tanh" (the tanh approximation, GPT-2's and Hugging Face's gelu_new /
  // gelu_pytorch_tanh; the default) or "none" (the exact erf form, Hugging Face's gelu), as
  // torch::gelu's `approximate` names them. Others: fabric::Error when the model is built.
  std::string gelu = "tanh";
  double layer_norm_epsilon = 1e-5;  // every LayerNorm's eps (GPT-2's layer_norm_epsilon)
  // loss(): the output layer and the cross-entropy as one fused CUDA step where it applies
  // (fabric/models/fused_cross_entropy.h); false: the logits through ATen, as forward() + lm_loss.
  bool fused_loss = true;
  // LayerNorms (and the residual add before ln_2) as fused CUDA kernels with 16-bit outputs where
  // they apply (fabric/models/fused_layer_norm.h); elsewhere (CPU, float32) ATen's, unchanged.
  // On since its leak and fsdp fixes passed on an H200: +11.6% tokens/s for GPT-2 124M there
  // (docs/benchmarks.md). false: ATen's LayerNorm everywhere.
  bool fused_layer_norm = true;
  // "gpt2" (124M), "gpt2-medium" (350M), "gpt2-large" (774M), "gpt2-xl" (1.5B), "tiny" (4
  // layers, 4 heads, 128 wide, 256 positions, vocabulary 256: byte-level text on a CPU). Throws
  // fabric::Error naming the presets otherwise.
  static GPTConfig preset(const std::string& name);
  // Parameters of the model (the tied output projection counted once).
  int64_t parameters() const;
  // Floating-point operations per token of a training step (forward + backward) at sequence
  // length block_size, as PaLM's appendix B and nanoGPT count them: 6 · N + 12 · n_layer · n_embd
  // · block_size, N the parameters without the position embedding. For MFU.
  double flops_per_token() const;
};

// The process group of context parallelism (fabric/models/context_parallel.h; declared only, so
// that this header needs no c10d).
struct ContextParallelGroup;

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, C] → [B, T, C]
  // forward(produce(nullptr)), with c_attn's float8 input cast made by `produce` when c_attn takes
  // one (fabric::nn::produced_forward; like: produce's input, [B, T, C]).
  torch::Tensor forward(const torch::Tensor& like, const fabric::nn::Fp8Producer& produce);
  fabric::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
  // Context parallelism (GPTImpl::set_context_parallel): attention over the whole sequence by
  // fabric::nn::ring_attention over this group; null: SDPA on the tokens given.
  std::shared_ptr<const ContextParallelGroup> context_parallel;

 private:
  // The heads' attention and c_proj on c_attn's output (device: the input's).
  torch::Tensor attend(const torch::Tensor& qkv_all, const torch::Device& device);
  int64_t head_size_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  // forward(produce(nullptr)), c_fc's float8 input cast made by `produce` (as attention's).
  torch::Tensor forward(const torch::Tensor& like, const fabric::nn::Fp8Producer& produce);
  fabric::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};

 private:
  std::string gelu_;  // torch::gelu's approximate: "tanh" or "none"
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};

 private:
  bool fused_layer_norm_;
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module, public fabric::nn::TensorParallelPlanned {
 public:
  explicit GPTImpl(const GPTConfig& c);
  // gpt_tensor_parallel_plan(config()) (fabric.strategy: model_parallel uses it).
  fabric::nn::TensorParallelPlan tensor_parallel_plan() const override;
  // Runs a block (e.g. through fabric::checkpoint_activations); null: block->forward.
  using RunBlock = std::function<torch::Tensor(Block&, const torch::Tensor&)>;
  // tokens: int64 [B, T] with T <= block_size (fabric::Error otherwise) → logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor forward(const torch::Tensor& tokens, const RunBlock& run_block);
  // Mean next-token cross-entropy against targets [B, T]: lm_loss(forward(tokens), targets), and
  // without the float32 logits where linear_cross_entropy can fuse (config().fused_loss).
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                     const RunBlock& run_block = nullptr);
  // The final LayerNorm's output [B, T, C] (the output layer's input).
  torch::Tensor hidden(const torch::Tensor& tokens, const RunBlock& run_block = nullptr);
  // Context parallelism (issue 71) over `group` (cp ranks; null: off): forward, loss and hidden
  // then take this rank's load-balanced share of each sequence, tokens [B, T / cp] in
  // fabric::nn::cp_rank_positions(T, cp, rank) order (chunks rank and 2·cp − 1 − rank of 2·cp),
  // with the learned positions at their global indices and attention over the whole sequence
  // (fabric::nn::ring_attention); everything else is per position. loss() is then the mean over
  // this rank's tokens: the mean of it over the group (every rank holds as many) is the whole
  // sequence's, and the parameters' gradients averaged over the group are the whole sequence's.
  // fabric::Error: dropout > 0 (attention dropout does not run in the ring) or a model split
  // under sequence parallelism.
  void set_context_parallel(fabric::nn::ProcessGroupPtr group);

  const GPTConfig& config() const { return config_; }
  fabric::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  std::vector<Block> blocks;  // registered as transformer.h.0, transformer.h.1, ...
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GPTConfig config_;
};
TORCH_MODULE(GPT);

// The pieces of GPTImpl::loss around its blocks, on the modules given (a GPT's own, or those a
// pipeline stage holds: fabric/models/pipeline_stages.h). gpt_embed: the first block's input from
// token ids [B, T] (T <= c.block_size; fabric::Error otherwise); no sequence parallelism.
// gpt_head_loss: the mean next-token cross-entropy from the final LayerNorm's output `h` through
// the output layer tied to `wte` (vocabulary-parallel when wte is split over tp; fused where
// c.fused_loss and linear_cross_entropy allow).
torch::Tensor gpt_embed(const GPTConfig& c, fabric::nn::Embedding& wte, torch::nn::Embedding& wpe,
                        torch::nn::Dropout& drop, const torch::Tensor& tokens);
torch::Tensor gpt_head_loss(const GPTConfig& c, fabric::nn::Embedding& wte, const torch::Tensor& h,
                            const torch::Tensor& targets);
// The final LayerNorm as GPTImpl::hidden applies it (fused with a 16-bit output where it can).
torch::Tensor gpt_final_norm(const GPTConfig& c, torch::nn::LayerNorm& ln_f,
                             const torch::Tensor& x);

// The GPT's tensor-parallel plan for a model of config `c`: c_attn column(3) (q, k and v each
// split by whole heads), attn.c_proj row (by heads), mlp.c_fc column, mlp.c_proj row,
// transformer.wte vocab (and with it the tied output layer).
fabric::nn::TensorParallelPlan gpt_tensor_parallel_plan(const GPTConfig& c);

}  // namespace fabric::models

#endif  // FABRIC_MODELS_GPT_H_
