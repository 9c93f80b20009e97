// fabric::nn tensor parallelism (Megatron-LM's scheme) on a c10d process group: layers whose
// weights are split over the ranks of a `tp` group, the collectives between them as autograd
// functions, and parallelize(), which applies a plan of module-name patterns to a model.
//
// Why modules of our own: a LibTorch module's forward is not virtual and has no hooks, so nothing
// can change what a torch::nn::Linear does once the model's forward calls it. fabric::nn::Linear
// and fabric::nn::Embedding are drop-ins (same options, same parameter names "weight" and "bias",
// the same initialization, drawing the same random numbers, the same forward) that a plan can
// split. A model that uses them for the layers to split can be parallelized; everything else in
// it stays plain LibTorch.
//
// Styles (what parallelize() does to the module a rule names):
//   column(parts): Linear [out, in]: each rank keeps out / tp rows (with `parts` > 1 the output is
//     `parts` equal blocks, e.g. q, k, v, each split: rank r keeps the r-th slice of every block).
//     Forward: the input stays whole (its gradient is all-reduced in backward), the output is this
//     rank's slice of the features.
//   row: Linear [out, in]: each rank keeps in / tp columns; the input is this rank's slice of the
//     features (a column layer's output), the partial outputs are all-reduced, then the bias
//     (whole on every rank) is added.
//   vocab: Embedding [V, C]: each rank keeps V / tp rows (ids [r · V/tp, (r + 1) · V/tp)); ids of
//     other ranks give zeros, and the rows are all-reduced. With a tied output layer,
//     vocab_parallel_logits() / vocab_parallel_cross_entropy() compute on the rank's rows only:
//     the full logits never exist on one rank.
// So a column layer followed by a row layer (attention's qkv → heads → projection, an MLP's
// fc → GELU → proj) communicates once forward and once backward, and the heads are split.
//
//   fabric::nn::TensorParallelPlan plan{{"blocks.*.fc", fabric::nn::TensorParallelStyle::column()},
//                                       {"blocks.*.proj", fabric::nn::TensorParallelStyle::row()}};
//   fabric::nn::parallelize(*model, plan, mesh.group("tp"));   // before the optimizer is built
//
// Under Fabric (fabric.strategy: model_parallel) a model carries its plan instead
// (TensorParallelPlanned, at the end) and the strategy calls parallelize(). What a user's own
// model changes, with a complete attention + MLP block: docs/tensor_parallel.md.
//
// Parameters a rule names are replaced in place by this rank's slice (the Parameter objects stay:
// anything holding them sees the slice); every other parameter stays whole on every rank and gets
// the same gradient there. A LoRA adapter of a split layer (LinearImpl::set_lora) is split with
// it: lora_A like the layer's input, lora_B like its output (LinearImpl::lora_cut). The collectives
// are collective over the group: every rank of it runs the same forward and backward.
#ifndef FABRIC_NN_TENSOR_PARALLEL_H_
#define FABRIC_NN_TENSOR_PARALLEL_H_

#include <c10/util/intrusive_ptr.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/options/embedding.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fabric/nn/fp8.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fabric::nn {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// --- Collectives as autograd functions (Megatron's f and g) --------------------------------------
// Forward identity, backward all-reduce (sum): where a whole input enters column layers.
torch::Tensor copy_to_parallel(const torch::Tensor& x, const ProcessGroupPtr& group);
// Forward all-reduce (sum), backward identity: where row layers' partial outputs leave.
torch::Tensor reduce_from_parallel(const torch::Tensor& x, const ProcessGroupPtr& group);
// Forward: every rank's x concatenated along `dim`; backward: this rank's slice of the gradient.
torch::Tensor gather_from_parallel(const torch::Tensor& x, const ProcessGroupPtr& group,
                                   int64_t dim);
// Forward: this rank's slice along `dim` (size divisible by the group's); backward: all-gather.
torch::Tensor scatter_to_parallel(const torch::Tensor& x, const ProcessGroupPtr& group,
                                  int64_t dim);
// Sequence parallelism's pair. Forward all-gather along `dim`, backward reduce-scatter (the
// gradient of a whole tensor each rank used partly): where cut activations enter a column layer.
torch::Tensor gather_sequence(const torch::Tensor& x, const ProcessGroupPtr& group, int64_t dim);
// Forward reduce-scatter along `dim` (partial sums → this rank's slice of the total), backward
// all-gather: where a row layer's partial outputs leave.
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, const ProcessGroupPtr& group,
                                      int64_t dim);

// --- Layers --------------------------------------------------------------------------------------

struct TensorParallelStyle {
  enum class Kind { kColumn, kRow, kVocab };
  Kind kind = Kind::kColumn;
  int64_t parts = 1;  // column only: the output's equal blocks, each split over the ranks
  // Units of this many elements the cut keeps whole (an attention head's width): each block's
  // count of them must be a multiple of tp. `unit_name` names them in that error.
  int64_t unit = 1;
  std::string unit_name;
  static TensorParallelStyle column(int64_t parts = 1) { return of(Kind::kColumn, parts); }
  static TensorParallelStyle row() { return of(Kind::kRow, 1); }
  static TensorParallelStyle vocab() { return of(Kind::kVocab, 1); }
  static TensorParallelStyle of(Kind kind, int64_t parts) {
    TensorParallelStyle out;
    out.kind = kind;
    out.parts = parts;
    return out;
  }
  // This style cutting only between units of `width` elements, e.g. column(3).in_units(64,
  // "attention heads"): parallelize() refuses a tp that would split one.
  TensorParallelStyle in_units(int64_t width, std::string name) const {
    TensorParallelStyle out = *this;
    out.unit = width;
    out.unit_name = std::move(name);
    return out;
  }
  std::string name() const;  // "column", "column(3)", "row", "vocab"
};

// How a parallelized layer's weight is cut: along `dim` (0: rows, 1: columns) into `size`
// slices of each of `parts` equal blocks; this rank holds slice `rank` of every block.
struct TensorParallelShard {
  // Out of line: c10d::ProcessGroup stays an incomplete type here.
  TensorParallelShard(ProcessGroupPtr group, TensorParallelStyle style, int64_t rank, int64_t size,
                      int64_t dim, std::vector<int64_t> full_sizes);
  TensorParallelShard(const TensorParallelShard&);
  TensorParallelShard(TensorParallelShard&&) noexcept;
  TensorParallelShard& operator=(const TensorParallelShard&);
  TensorParallelShard& operator=(TensorParallelShard&&) noexcept;
  ~TensorParallelShard();

  ProcessGroupPtr group;
  TensorParallelStyle style;
  int64_t rank = 0, size = 1;
  int64_t dim = 0;
  std::vector<int64_t> full_sizes;  // the whole weight's sizes
  bool sequence_parallel = false;   // the plan's (TensorParallelPlan::sequence_parallel)
  std::string module_name;          // the layer's name in the model (parallelize() sets it)
  // The whole sequence length enter_sequence_parallel last cut for this shard's plan (-1: never),
  // shared by the shards of one parallelize() (each constructed shard starts its own): a layer
  // under sequence parallelism tells activations that were never cut from its own cut of them.
  std::shared_ptr<std::atomic<int64_t>> entered_sequence;
  // This rank's slice of a whole tensor cut like the weight (a bias: along dim 0 when the style
  // cuts rows). Used by parallelize() and to load a whole checkpoint.
  torch::Tensor slice(const torch::Tensor& whole, int64_t along) const;
  // The whole tensor from every rank's slice (collective over the group).
  torch::Tensor gather(const torch::Tensor& piece, int64_t along) const;
};

// A model's side of sequence parallelism, for the layer `shard` belongs to (identity when the
// plan has none): enter cuts whole activations [B, T, ...] to this rank's T / tp positions
// (fabric::Error naming T when tp does not divide it); leave gathers them whole again. A split
// layer under sequence parallelism whose input was not cut this way (the model never calls
// enter, or hands it whole activations) throws fabric::Error naming the layer and this fix.
torch::Tensor enter_sequence_parallel(const torch::Tensor& x,
                                      const std::optional<TensorParallelShard>& shard);
torch::Tensor leave_sequence_parallel(const torch::Tensor& x,
                                      const std::optional<TensorParallelShard>& shard);
// A whole tensor (a norm's weight) used on this rank's positions: its gradient summed over the
// ranks in backward (identity when the plan has no sequence parallelism).
torch::Tensor sequence_parallel_weight(const torch::Tensor& weight,
                                       const std::optional<TensorParallelShard>& shard);

// A Linear layer a tensor-parallel plan can split; otherwise torch::nn::Linear's twin.
class LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features)
      : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);
  void reset() override;
  void reset_parameters();  // as torch::nn::Linear's (Kaiming uniform; uniform bias)
  void pretty_print(std::ostream& stream) const override;
  // x [..., in] → [..., out] through ATen's linear (one GEMM with the bias for 3-D input too);
  // parallelized: as its style says (the file comment).
  torch::Tensor forward(const torch::Tensor& x);
  // forward(torch::gelu(x, "tanh")), with the GELU fused into the float8 cast when the layer runs
  // whole in float8 (fp8_linear's gelu_tanh_input); the same values either way.
  torch::Tensor forward_gelu_tanh(const torch::Tensor& x);
  // Whether forward(x) is one float8 GEMM of a trainable weight (fp8_linear): float8 on, not split,
  // no adapter, a weight not stored in bf16 or float8 (for x's dtype).
  bool whole_fp8(const torch::Tensor& x) const;
  const std::optional<TensorParallelShard>& parallel() const { return parallel_; }
  void set_parallel(TensorParallelShard shard);  // parallelize() calls it
  void clear_parallel() { parallel_.reset(); }   // unparallelize() calls it, after the gather
  // Float8 GEMMs (fabric/nn/fp8.h) instead of ATen's linear; convert_to_fp8() sets it. kDelayed:
  // with a fresh Fp8History of `history_length` steps and `grad_margin` (a clone gets its own,
  // fresh too); fast_accumulation: fp8_linear's.
  void set_fp8(bool on, Fp8Scaling scaling = Fp8Scaling::kTensorwise, int64_t history_length = 16,
               bool fast_accumulation = true, int64_t grad_margin = Fp8History::kDefaultGradMargin);
  bool fp8() const { return fp8_; }
  Fp8Scaling fp8_scaling() const { return fp8_scaling_; }
  bool fp8_fast_accumulation() const { return fp8_fast_accumulation_; }
  const std::optional<Fp8History>& fp8_history() const { return fp8_history_; }
  std::optional<Fp8History>& fp8_history() { return fp8_history_; }  // (fp8_history.h restores it)
  // The per-row scale buffer of a weight stored in float8 (fabric/nn/frozen_weight.h's
  // kWeightScale, LoRA's base_dtype fp8), or an undefined tensor.
  torch::Tensor weight_scale() const;
  // A LoRA adapter (fabric/nn/lora.h: apply_lora, merge_lora): registers the submodules lora_A
  // [rank, in] (Kaiming uniform, a = sqrt(5)) and lora_B [out, rank] (zeros), torch::nn::Linear
  // without bias (peft's names: "lora_A.weight"), and forward adds
  // lora_B(lora_A(dropout(x))) · scaling to the layer's output. fabric::Error on a layer that has
  // an adapter already.
  // Split by tensor parallelism (set_parallel before or after): A like the layer's input, B like
  // its output, so the layer computes and trains exactly what it does whole:
  //   column: A whole [rank, in]; B this rank's rows [out / tp, rank] (of every part, as the
  //     weight's). x A on every rank, its gradient summed over the ranks (B's slices each give
  //     part of it); under sequence parallelism x A on this rank's positions, gathered, A's
  //     gradient summed.
  //   row: A this rank's columns [rank, in / tp]; B whole [out, rank]. The partial x A summed
  //     over the ranks before B (under sequence parallelism reduce-scattered: B on this rank's
  //     positions, its gradient summed).
  // Dropout draws the mask of the whole input, as one process draws it, and keeps this rank's
  // part (a row layer's features, a column layer's positions under sequence parallelism); a
  // column layer's whole input gets the same mask on every rank (the ranks' generators are in
  // step). One extra collective of [..., rank] per adapted layer forward or backward.
  void set_lora(int64_t rank, double scaling, double dropout);
  void clear_lora();  // the adapter's submodules removed; forward as before set_lora
  int64_t lora_rank() const { return lora_rank_; }  // 0: no adapter
  double lora_scaling() const { return lora_scaling_; }
  double lora_dropout() const { return lora_dropout_; }
  // The adapter tensor a split layer's adapter has cut over tp: "lora_B.weight" of a column
  // layer along 0 (by the weight's parts), "lora_A.weight" of a row layer along 1; its whole
  // sizes. nullopt for a layer without adapter or not split (the other adapter tensor is whole).
  struct LoraCut {
    std::string name;  // under the layer
    torch::Tensor tensor;
    int64_t along = 0;
    std::vector<int64_t> whole_sizes;
  };
  std::optional<LoraCut> lora_cut() const;

  torch::nn::LinearOptions options;
  torch::Tensor weight, bias;
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  // null without an adapter

 private:
  torch::Tensor base_forward(const torch::Tensor& x);
  torch::Tensor lora_parallel_forward(const torch::Tensor& x);  // B A dropout(x), split
  void register_lora();  // lora_A, lora_B of lora_rank_ (set_lora, and reset() for clone())
  void cut_lora();       // the adapter tensor a split layer cuts: this rank's slice of it
  std::optional<TensorParallelShard> parallel_;
  bool fp8_ = false;
  Fp8Scaling fp8_scaling_ = Fp8Scaling::kTensorwise;
  bool fp8_fast_accumulation_ = true;
  std::optional<Fp8History> fp8_history_;  // kDelayed's
  int64_t lora_rank_ = 0;
  double lora_scaling_ = 0, lora_dropout_ = 0;
};
TORCH_MODULE(Linear);

// The attention heads this rank holds of a layer cut between heads: n_head / tp when a plan split
// `layer` (column or row), else n_head. A split qkv layer's output is this rank's heads only, so
// reshape it with this count (or -1), never the model's n_head:
//   q.view({B, T, fabric::nn::local_heads(qkv, n_head), head_size})
// Ask in forward(): before Fabric's setup splits it the layer is whole. fabric::Error naming the
// layer when tp does not divide n_head (a rank would hold part of a head), or n_head < 1.
int64_t local_heads(const LinearImpl& layer, int64_t n_head);
inline int64_t local_heads(const Linear& layer, int64_t n_head) {
  return local_heads(*layer, n_head);
}

// An Embedding a tensor-parallel plan can split by vocabulary; otherwise torch::nn::Embedding's
// twin (weight ~ N(0, 1); no padding_idx, max_norm or sparse gradients).
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl> {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : EmbeddingImpl(torch::nn::EmbeddingOptions(num_embeddings, embedding_dim)) {}
  explicit EmbeddingImpl(const torch::nn::EmbeddingOptions& options);
  void reset() override;
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;
  torch::Tensor forward(const torch::Tensor& ids);
  const std::optional<TensorParallelShard>& parallel() const { return parallel_; }
  void set_parallel(TensorParallelShard shard);
  void clear_parallel() { parallel_.reset(); }
  // The first id this rank's rows hold (0 when not parallelized).
  int64_t vocab_start() const;

  torch::nn::EmbeddingOptions options;
  torch::Tensor weight;

 private:
  std::optional<TensorParallelShard> parallel_;
};
TORCH_MODULE(Embedding);

// Logits of an output layer tied to `embedding` (h · weightᵀ): whole [..., V] on every rank
// (gathered when the embedding is vocabulary-parallel).
torch::Tensor tied_logits(const torch::Tensor& h, Embedding& embedding);
// Mean cross-entropy of those logits against targets [...] (int64 ids in [0, V)). Vocabulary-
// parallel: from this rank's V / tp logits, with three all-reduces of [...]-sized tensors (max, sum
// of exponentials, target logit): the whole logits are never formed. Otherwise `whole` (e.g.
// fabric::models::linear_cross_entropy) computes it. Targets -100 are ignored (the mean is over
// the others), as torch's cross_entropy ignores them.
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_start,
                                           const ProcessGroupPtr& group);

// --- Plans ---------------------------------------------------------------------------------------

// Module-name patterns → styles. A pattern matches a module's full name (as named_modules() gives
// it, e.g. "transformer.h.3.attn.c_attn"); '*' matches one name component
// ("transformer.h.*.mlp.c_fc"). The first rule that matches a module decides.
struct TensorParallelPlan {
  std::vector<std::pair<std::string, TensorParallelStyle>> rules;
  // Sequence parallelism (Megatron-LM's): between the split layers the activations [B, T, ...]
  // are cut along T (dimension 1) over the ranks instead of whole on each, so the norms,
  // dropout and residual adds run on T / tp positions. A column layer all-gathers its input along
  // T (reduce-scatter in backward), a row layer reduce-scatters its output along T (all-gather in
  // backward) instead of all-reducing it, and whole tensors used on a slice of T (norm weights,
  // row layers' biases) have their gradients summed over the ranks. The model enters and leaves
  // the cut activations itself (enter_sequence_parallel / leave_sequence_parallel; the GPT does).
  bool sequence_parallel = false;
};

// Whether `pattern` matches `name` (components separated by '.', '*' is any one component).
bool plan_pattern_matches(const std::string& pattern, const std::string& name);

// Splits the modules `plan` names over `group` (see the file comment); returns their names.
// fabric::ConfigError, naming the rule, the module and the fix, for: a rule that matches no module
// (listing the model's Linear, or Embedding, names closest to the rule, as patterns); a match that
// is not a fabric::nn::Linear (column, row) or fabric::nn::Embedding (vocab): a torch::nn one
// (the drop-in to build instead, with its sizes), or a module holding layers (the names inside
// to point the rule at); a size the group's size does not divide (naming the size and tp). A
// module already split: fabric::Error. A group of one rank changes nothing. Call before building
// the optimizer.
std::vector<std::string> parallelize(torch::nn::Module& model, const TensorParallelPlan& plan,
                                     const ProcessGroupPtr& group);

// Every split module of `model` (and its LoRA adapter) whole again and no longer split
// (collective over each one's group): what Fabric's model_parallel strategy does at teardown, so
// the model works alone after.
void unparallelize(torch::nn::Module& model);

// Whether `tensor` is a parameter split over its tp group (a split layer's weight, a column
// layer's bias, the adapter tensor LinearImpl::lora_cut names), as opposed to one every tp rank
// holds whole.
bool is_split_parameter(torch::nn::Module& model, const torch::Tensor& tensor);

// A model that carries its own plan: fabric.strategy: model_parallel asks the module it sets up
// for it (the GPT does: fabric::models::gpt_tensor_parallel_plan). Derive the module's class
// (the Impl of a ModuleHolder) from it beside torch::nn::Module (docs/tensor_parallel.md):
//   struct NetImpl : torch::nn::Module, fabric::nn::TensorParallelPlanned { ... };
class TensorParallelPlanned {
 public:
  virtual ~TensorParallelPlanned() = default;
  virtual TensorParallelPlan tensor_parallel_plan() const = 0;
};

}  // namespace fabric::nn

#endif  // FABRIC_NN_TENSOR_PARALLEL_H_
