#include "fabric/nn/tensor_parallel.h"

#include <torch/autograd.h>
#include <torch/nn/functional/embedding.h>
#include <torch/nn/init.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <memory>
#include <optional>
#include <ostream>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/frozen_weight.h"

namespace fabric::nn {

namespace {

std::string describe(const torch::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + " [";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// "fabric::nn::Linear 'blocks.0.attn.qkv' (column(3), tp 2)": a split layer, for errors.
std::string layer_label(const TensorParallelShard& p) {
  return "fabric::nn::Linear " +
         (p.module_name.empty() ? std::string() : "'" + p.module_name + "' ") + "(" +
         p.style.name() + ", tp " + std::to_string(p.size) + ")";
}

// A column layer under sequence parallelism gathers its input along T: it must be this rank's
// T / tp positions of activations enter_sequence_parallel cut. Whole activations would be
// gathered to tp x T positions and fail later in LibTorch's words (a GEMM's or a view's shapes).
void check_sequence_cut(const TensorParallelShard& p, const torch::Tensor& x) {
  const int64_t entered = p.entered_sequence ? p.entered_sequence->load() : -1;
  const std::string fix =
      "call x = fabric::nn::enter_sequence_parallel(x, layer->parallel()) after the embeddings "
      "and leave_sequence_parallel before the head (docs/tensor_parallel.md), or set "
      "fabric.model_parallel.sequence_parallel: false";
  if (entered < 0)
    throw Error(layer_label(p) +
                " runs under sequence parallelism, but the model never cut its "
                "activations along the sequence: " +
                fix);
  if (x.dim() < 3 || x.size(1) * p.size != entered)
    throw Error(layer_label(p) + " runs under sequence parallelism and takes this rank's " +
                std::to_string(entered / p.size) + " of " + std::to_string(entered) +
                " positions, [B, T / tp, ...], but its input is " + describe(x) +
                ": give the split layers the activations between enter_sequence_parallel and "
                "leave_sequence_parallel, or set fabric.model_parallel.sequence_parallel: false");
}

}  // namespace

// --- Linear --------------------------------------------------------------------------------------

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) { reset(); }

void LinearImpl::reset() {
  weight =
      register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) {
    bias = register_parameter("bias", torch::empty(options.out_features()));
  } else {
    bias = register_parameter("bias", {}, /*requires_grad=*/false);
  }
  reset_parameters();
  if (lora_rank_ > 0) register_lora();  // clone(): the copy's adapter, its values copied after
  if (fp8_history_) {                   // clone(): its own history, fresh
    const int64_t length = fp8_history_->length, margin = fp8_history_->grad_margin;
    fp8_history_.emplace(length, margin);
  }
}

void LinearImpl::set_fp8(bool on, Fp8Scaling scaling, int64_t history_length,
                         bool fast_accumulation, int64_t grad_margin) {
  fp8_ = on;
  fp8_scaling_ = scaling;
  fp8_fast_accumulation_ = fast_accumulation;
  fp8_history_.reset();
  if (on && scaling == Fp8Scaling::kDelayed) fp8_history_.emplace(history_length, grad_margin);
}

void LinearImpl::reset_parameters() {
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5));
  if (bias.defined()) {
    const auto fans = torch::nn::init::_calculate_fan_in_and_fan_out(weight);
    const double bound = 1 / std::sqrt(static_cast<double>(std::get<0>(fans)));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "fabric::nn::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias();
  if (fp8_)
    stream << (fp8_scaling_ == Fp8Scaling::kRowwise   ? ", float8 rowwise"
               : fp8_scaling_ == Fp8Scaling::kDelayed ? ", float8 delayed"
                                                      : ", float8");
  if (parallel_)
    stream << ", tp=" << parallel_->style.name() << " " << parallel_->rank << "/"
           << parallel_->size;
  if (lora_rank_ > 0) stream << ", lora r=" << lora_rank_ << " scaling=" << lora_scaling_;
  stream << ")";
}

void LinearImpl::set_parallel(TensorParallelShard shard) {
  torch::NoGradGuard no_grad;
  const int64_t along = shard.dim;
  // replace_data: the tensors may be an empty init's, on the meta device.
  replace_data(weight, shard.slice(weight, along).clone());
  if (bias.defined() && along == 0) replace_data(bias, shard.slice(bias, 0).clone());
  // A float8 weight's per-row scale follows its rows: cut on a column layer, whole on a row one.
  if (const torch::Tensor scale = weight_scale(); scale.defined() && along == 0)
    replace_data(scale, shard.slice(scale, 0).clone());
  parallel_ = std::move(shard);
  cut_lora();
}

std::optional<LinearImpl::LoraCut> LinearImpl::lora_cut() const {
  if (lora_rank_ == 0 || !parallel_) return std::nullopt;
  const int64_t in = options.in_features(), out = options.out_features();
  if (parallel_->style.kind == TensorParallelStyle::Kind::kRow)
    return LoraCut{"lora_A.weight", lora_A->weight, 1, {lora_rank_, in}};
  return LoraCut{"lora_B.weight", lora_B->weight, 0, {out, lora_rank_}};
}

void LinearImpl::cut_lora() {
  const auto cut = lora_cut();
  if (!cut || cut->tensor.size(cut->along) != cut->whole_sizes[cut->along]) return;
  torch::NoGradGuard no_grad;
  torch::Tensor t = cut->tensor;
  replace_data(t, parallel_->slice(t, cut->along).clone());
}

void LinearImpl::register_lora() {
  const int64_t in = options.in_features(), out = options.out_features();
  torch::nn::Linear a(torch::nn::LinearOptions(in, lora_rank_).bias(false));  // Kaiming uniform
  torch::nn::Linear b(torch::nn::LinearOptions(lora_rank_, out).bias(false));
  {
    torch::NoGradGuard no_grad;
    b->weight.zero_();
  }
  if (weight.is_meta()) {
    // An empty init's recording (fabric/nn/empty_init.h): the adapters are meta tensors already,
    // and a device named here would be replayed as the meta device: the dtype only.
    a->to(weight.scalar_type());
    b->to(weight.scalar_type());
  } else {
    a->to(weight.device(), weight.scalar_type());
    b->to(weight.device(), weight.scalar_type());
  }
  lora_A = register_module("lora_A", a);
  lora_B = register_module("lora_B", b);
  // A split layer: drawn whole (every rank the same numbers, as one process), then cut.
  cut_lora();
}

void LinearImpl::set_lora(int64_t rank, double scaling, double dropout) {
  if (lora_rank_ > 0) throw Error("fabric::nn::Linear: it has a LoRA adapter already");
  if (rank < 1) throw Error("fabric::nn::Linear: LoRA rank must be at least 1");
  lora_rank_ = rank;
  lora_scaling_ = scaling;
  lora_dropout_ = dropout;
  register_lora();
}

void LinearImpl::clear_lora() {
  if (lora_rank_ == 0) return;
  unregister_module("lora_A");
  unregister_module("lora_B");
  lora_A = nullptr;
  lora_B = nullptr;
  lora_rank_ = 0;
  lora_scaling_ = lora_dropout_ = 0;
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (lora_rank_ == 0) return base_forward(x);
  // peft's order: the base output, then B(A(dropout(x))) scaled, added.
  if (parallel_) {
    const torch::Tensor base = base_forward(x);
    return base + lora_parallel_forward(x) * lora_scaling_;
  }
  const torch::Tensor in = lora_dropout_ > 0 ? torch::dropout(x, lora_dropout_, is_training()) : x;
  return base_forward(x) + lora_B->forward(lora_A->forward(in)) * lora_scaling_;
}

torch::Tensor LinearImpl::weight_scale() const {
  const auto buffers = named_buffers(/*recurse=*/false);
  const torch::Tensor* scale = buffers.find(kWeightScale);
  return scale ? *scale : torch::Tensor();
}

bool LinearImpl::whole_fp8(const torch::Tensor& x) const {
  return fp8_ && !parallel_ && lora_rank_ == 0 && !is_stored_weight(weight, weight_scale(), x);
}

torch::Tensor LinearImpl::forward_gelu_tanh(const torch::Tensor& x) {
  // Fused only where the whole layer is one float8 GEMM of a trainable weight; else as written.
  if (!whole_fp8(x)) return forward(torch::gelu(x, "tanh"));
  return fp8_linear(x, weight, bias, fp8_scaling_, fp8_history_ ? &*fp8_history_ : nullptr,
                    /*gelu_tanh_input=*/true, fp8_fast_accumulation_);
}

namespace {

// Dropout of x, this rank's part (its chunk of `size` along `dim`) of a whole tensor: the whole
// tensor's mask drawn as one process draws it for the whole (the same generator calls, the same
// numbers), this rank's part of it applied. x * mask is what torch::dropout computes.
torch::Tensor dropout_of_part(const torch::Tensor& x, double p, bool training, int64_t dim,
                              int64_t rank, int64_t size) {
  if (p == 0 || !training) return x;
  dim = dim < 0 ? dim + x.dim() : dim;
  std::vector<int64_t> whole = x.sizes().vec();
  whole[dim] *= size;
  const torch::Tensor mask = torch::dropout(torch::ones(whole, x.options()), p, true);
  return x * mask.narrow(dim, rank * x.size(dim), x.size(dim));
}

}  // namespace

torch::Tensor LinearImpl::lora_parallel_forward(const torch::Tensor& x) {
  const TensorParallelShard& p = *parallel_;
  const torch::Tensor &a = lora_A->weight, &b = lora_B->weight;
  const bool training = is_training();
  if (p.style.kind == TensorParallelStyle::Kind::kColumn) {
    if (!p.sequence_parallel) {
      // x is whole and the same on every rank, and so is its mask. Each rank's B slice gives part
      // of the gradient of x A: summed over the ranks (A's gradient and x's through A whole).
      const torch::Tensor in = lora_dropout_ > 0 ? torch::dropout(x, lora_dropout_, training) : x;
      return torch::linear(copy_to_parallel(torch::linear(in, a), p.group), b);
    }
    // This rank's positions: x A on them, gathered whole (backward: reduce-scattered, so each
    // rank's positions get every B slice's part); A used on part of the positions.
    const torch::Tensor in = dropout_of_part(x, lora_dropout_, training, 1, p.rank, p.size);
    const torch::Tensor xa = torch::linear(in, sequence_parallel_weight(a, parallel_));
    return torch::linear(gather_sequence(xa, p.group, 1), b);
  }
  // Row: this rank's input features through its columns of A, summed over the ranks, then B.
  const torch::Tensor in = dropout_of_part(x, lora_dropout_, training, -1, p.rank, p.size);
  const torch::Tensor partial = torch::linear(in, a);
  if (!p.sequence_parallel) return torch::linear(reduce_from_parallel(partial, p.group), b);
  return torch::linear(reduce_scatter_sequence(partial, p.group, 1),
                       sequence_parallel_weight(b, parallel_));
}

torch::Tensor LinearImpl::base_forward(const torch::Tensor& x) {
  const torch::Tensor scale = weight_scale();  // a float8 weight's, if any
  auto gemm = [&](const torch::Tensor& in, const torch::Tensor& b) {
    // A frozen weight stored in bf16 or float8 (LoRA's base): dequantized inside the GEMM.
    if (is_stored_weight(weight, scale, in)) return frozen_linear(in, weight, scale, b);
    return fp8_ ? fp8_linear(in, weight, b, fp8_scaling_, fp8_history_ ? &*fp8_history_ : nullptr,
                             /*gelu_tanh_input=*/false, fp8_fast_accumulation_)
                : torch::linear(in, weight, b);
  };
  if (!parallel_) return gemm(x, bias);
  const TensorParallelShard& p = *parallel_;
  if (p.style.kind == TensorParallelStyle::Kind::kColumn) {
    if (!p.sequence_parallel) return gemm(copy_to_parallel(x, p.group), bias);
    check_sequence_cut(p, x);
    return gemm(gather_sequence(x, p.group, 1), bias);
  }
  // Row: partial sums of every rank's input features, then the (whole) bias once; under
  // sequence parallelism each rank keeps its positions of the sum, and the bias's gradient on
  // them is partial.
  if (p.sequence_parallel) {
    torch::Tensor y = reduce_scatter_sequence(gemm(x, torch::Tensor()), p.group, 1);
    return bias.defined() ? y + copy_to_parallel(bias, p.group) : y;
  }
  torch::Tensor y = reduce_from_parallel(gemm(x, torch::Tensor()), p.group);
  return bias.defined() ? y + bias : y;
}

int64_t local_heads(const LinearImpl& layer, int64_t n_head) {
  if (n_head < 1)
    throw Error("fabric::nn::local_heads: n_head must be at least 1 (got " +
                std::to_string(n_head) + ")");
  const auto& p = layer.parallel();
  if (!p) return n_head;
  if (n_head % p->size != 0)
    throw Error(layer_label(*p) + " holds n_head / tp heads per rank, but " +
                std::to_string(n_head) + " heads do not divide by tp " + std::to_string(p->size) +
                ": make n_head a multiple of fabric.model_parallel.tensor_parallel_size "
                "(.in_units(head_size, \"attention heads\") on the plan rule refuses such a tp "
                "at setup); then reshape with -1 or the local head count, never n_head");
  return n_head / p->size;
}

// --- Embedding -----------------------------------------------------------------------------------

EmbeddingImpl::EmbeddingImpl(const torch::nn::EmbeddingOptions& options_) : options(options_) {
  reset();
}

void EmbeddingImpl::reset() {
  if (options.padding_idx() || options.max_norm() || options.sparse() ||
      options._weight().defined())
    throw Error(
        "fabric::nn::Embedding: padding_idx, max_norm, sparse and _weight are not supported");
  weight = register_parameter("weight",
                              torch::empty({options.num_embeddings(), options.embedding_dim()}));
  reset_parameters();
}

void EmbeddingImpl::reset_parameters() { torch::nn::init::normal_(weight); }

void EmbeddingImpl::pretty_print(std::ostream& stream) const {
  stream << "fabric::nn::Embedding(num_embeddings=" << options.num_embeddings()
         << ", embedding_dim=" << options.embedding_dim();
  if (parallel_) stream << ", tp=vocab " << parallel_->rank << "/" << parallel_->size;
  stream << ")";
}

void EmbeddingImpl::set_parallel(TensorParallelShard shard) {
  torch::NoGradGuard no_grad;
  replace_data(weight, shard.slice(weight, 0).clone());
  parallel_ = std::move(shard);
}

int64_t EmbeddingImpl::vocab_start() const {
  return parallel_ ? parallel_->rank * weight.size(0) : 0;
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& ids) {
  if (!parallel_) return torch::embedding(weight, ids);
  const int64_t start = vocab_start(), rows = weight.size(0);
  const torch::Tensor other = (ids < start).logical_or(ids >= start + rows);
  const torch::Tensor local = (ids - start).masked_fill(other, 0);
  const torch::Tensor e = torch::embedding(weight, local).masked_fill(other.unsqueeze(-1), 0.0);
  return reduce_from_parallel(e, parallel_->group);
}

torch::Tensor tied_logits(const torch::Tensor& h, Embedding& embedding) {
  const auto& p = embedding->parallel();
  if (!p) return torch::linear(h, embedding->weight);
  return gather_from_parallel(torch::linear(copy_to_parallel(h, p->group), embedding->weight),
                              p->group, -1);
}

}  // namespace fabric::nn
