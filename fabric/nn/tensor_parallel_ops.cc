// The collectives of tensor parallelism as autograd functions (copy_to_parallel and its kin,
// the sequence-parallel pair), the shards' slicing and gathering, and the vocabulary-parallel
// cross-entropy: the communication half of fabric/nn/tensor_parallel.h. The layers that use them
// (Linear, Embedding) are in tensor_parallel.cc, the plans in tensor_parallel_plan.cc.
#include <torch/autograd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::string describe(const torch::Tensor& t) {
  std::string s = std::string(c10::toString(t.scalar_type())) + " [";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// The group travels through autograd contexts as a raw pointer: the layers (and the mesh) that own
// the group outlive every backward of their forward.
c10d::ProcessGroup* raw(const ProcessGroupPtr& g) { return g.get(); }
c10d::ProcessGroup& from(AutogradContext* ctx) {
  return *reinterpret_cast<c10d::ProcessGroup*>(ctx->saved_data["group"].toInt());
}
void keep(AutogradContext* ctx, const ProcessGroupPtr& g) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(raw(g));
}

torch::Tensor all_reduce(c10d::ProcessGroup& g, const torch::Tensor& x, c10d::ReduceOp op) {
  std::vector<torch::Tensor> t = {x.contiguous().clone()};
  c10d::AllreduceOptions o;
  o.reduceOp = op;
  distributed::wait(g.allreduce(t, o), "tensor-parallel all_reduce (" + describe(x) + ")");
  return t[0];
}

torch::Tensor all_gather(c10d::ProcessGroup& g, const torch::Tensor& x, int64_t dim) {
  torch::Tensor in = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> sizes = in.sizes().vec();
  sizes[0] *= g.getSize();
  torch::Tensor out = torch::empty(sizes, in.options());
  distributed::wait(g._allgather_base(out, in), "tensor-parallel all_gather (" + describe(x) + ")");
  return out.movedim(0, dim).contiguous();
}

torch::Tensor slice_of(const torch::Tensor& x, int64_t rank, int64_t size, int64_t dim) {
  const int64_t n = x.size(dim);
  if (n % size != 0)
    throw Error("tensor parallel: size " + std::to_string(n) + " of dimension " +
                std::to_string(dim) + " is not divisible by tp " + std::to_string(size));
  return x.narrow(dim, rank * (n / size), n / size);
}

struct CopyToParallel : torch::autograd::Function<CopyToParallel> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, const ProcessGroupPtr& g) {
    keep(ctx, g);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduce(from(ctx), grad[0], c10d::ReduceOp::SUM), torch::Tensor()};
  }
};

struct ReduceFromParallel : torch::autograd::Function<ReduceFromParallel> {
  static torch::Tensor forward(AutogradContext*, torch::Tensor x, const ProcessGroupPtr& g) {
    return all_reduce(*g, x, c10d::ReduceOp::SUM);
  }
  static variable_list backward(AutogradContext*, variable_list grad) {
    return {grad[0], torch::Tensor()};
  }
};

torch::Tensor reduce_scatter(c10d::ProcessGroup& g, const torch::Tensor& x, int64_t dim) {
  const int64_t n = x.size(dim);
  if (n % g.getSize() != 0)
    throw Error("tensor parallel: size " + std::to_string(n) + " of dimension " +
                std::to_string(dim) + " is not divisible by tp " + std::to_string(g.getSize()));
  torch::Tensor in = x.movedim(dim, 0).contiguous();
  std::vector<int64_t> sizes = in.sizes().vec();
  sizes[0] /= g.getSize();
  torch::Tensor out = torch::empty(sizes, in.options());
  distributed::wait(g._reduce_scatter_base(out, in),
                    "tensor-parallel reduce_scatter (" + describe(x) + ")");
  return out.movedim(0, dim).contiguous();
}

// What AlongDim does in one direction.
enum class Move { kAllGather, kSlice, kReduceScatter };

torch::Tensor move(Move m, c10d::ProcessGroup& g, const torch::Tensor& x, int64_t dim) {
  switch (m) {
    case Move::kAllGather:
      return all_gather(g, x, dim);
    case Move::kSlice:
      return slice_of(x, g.getRank(), g.getSize(), dim).contiguous();
    case Move::kReduceScatter:
      break;
  }
  return reduce_scatter(g, x, dim);
}

// A collective along `dim` as an autograd function: Forward in forward, Backward (its
// transpose) in backward.
template <Move Forward, Move Backward>
struct AlongDim : torch::autograd::Function<AlongDim<Forward, Backward>> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, const ProcessGroupPtr& g,
                               int64_t dim) {
    keep(ctx, g);
    ctx->saved_data["dim"] = dim;
    return move(Forward, *g, x, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {move(Backward, from(ctx), grad[0], ctx->saved_data["dim"].toInt()), torch::Tensor(),
            torch::Tensor()};
  }
};
using GatherFromParallel = AlongDim<Move::kAllGather, Move::kSlice>;
using ScatterToParallel = AlongDim<Move::kSlice, Move::kAllGather>;
using GatherSequence = AlongDim<Move::kAllGather, Move::kReduceScatter>;
using ReduceScatterSequence = AlongDim<Move::kReduceScatter, Move::kAllGather>;

int64_t wrap_dim(int64_t dim, const torch::Tensor& x) { return dim < 0 ? dim + x.dim() : dim; }

}  // namespace

torch::Tensor copy_to_parallel(const torch::Tensor& x, const ProcessGroupPtr& group) {
  return CopyToParallel::apply(x, group);
}
torch::Tensor reduce_from_parallel(const torch::Tensor& x, const ProcessGroupPtr& group) {
  return ReduceFromParallel::apply(x, group);
}
torch::Tensor gather_from_parallel(const torch::Tensor& x, const ProcessGroupPtr& group,
                                   int64_t dim) {
  return GatherFromParallel::apply(x, group, wrap_dim(dim, x));
}
torch::Tensor scatter_to_parallel(const torch::Tensor& x, const ProcessGroupPtr& group,
                                  int64_t dim) {
  return ScatterToParallel::apply(x, group, wrap_dim(dim, x));
}

torch::Tensor gather_sequence(const torch::Tensor& x, const ProcessGroupPtr& group, int64_t dim) {
  return GatherSequence::apply(x, group, wrap_dim(dim, x));
}
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, const ProcessGroupPtr& group,
                                      int64_t dim) {
  return ReduceScatterSequence::apply(x, group, wrap_dim(dim, x));
}

torch::Tensor enter_sequence_parallel(const torch::Tensor& x,
                                      const std::optional<TensorParallelShard>& shard) {
  if (!shard || !shard->sequence_parallel) return x;
  if (x.dim() < 2 || x.size(1) % shard->size != 0)
    throw Error("sequence parallelism: a sequence of " +
                std::to_string(x.dim() < 2 ? 0 : x.size(1)) + " positions is not divisible by tp " +
                std::to_string(shard->size) +
                "; make the sequence length a multiple of fabric.model_parallel."
                "tensor_parallel_size, or turn sequence_parallel off");
  if (shard->entered_sequence) shard->entered_sequence->store(x.size(1));
  return scatter_to_parallel(x, shard->group, 1);
}

torch::Tensor leave_sequence_parallel(const torch::Tensor& x,
                                      const std::optional<TensorParallelShard>& shard) {
  if (!shard || !shard->sequence_parallel) return x;
  return gather_from_parallel(x, shard->group, 1);
}

torch::Tensor sequence_parallel_weight(const torch::Tensor& weight,
                                       const std::optional<TensorParallelShard>& shard) {
  if (!shard || !shard->sequence_parallel || !weight.defined()) return weight;
  return copy_to_parallel(weight, shard->group);
}

// --- Shards --------------------------------------------------------------------------------------

std::string TensorParallelStyle::name() const {
  switch (kind) {
    case Kind::kRow:
      return "row";
    case Kind::kVocab:
      return "vocab";
    case Kind::kColumn:
      break;
  }
  return parts == 1 ? "column" : "column(" + std::to_string(parts) + ")";
}

TensorParallelShard::TensorParallelShard(ProcessGroupPtr group_, TensorParallelStyle style_,
                                         int64_t rank_, int64_t size_, int64_t dim_,
                                         std::vector<int64_t> full_sizes_)
    : group(std::move(group_)),
      style(style_),
      rank(rank_),
      size(size_),
      dim(dim_),
      full_sizes(std::move(full_sizes_)),
      entered_sequence(std::make_shared<std::atomic<int64_t>>(-1)) {}
TensorParallelShard::TensorParallelShard(const TensorParallelShard&) = default;
TensorParallelShard::TensorParallelShard(TensorParallelShard&&) noexcept = default;
TensorParallelShard& TensorParallelShard::operator=(const TensorParallelShard&) = default;
TensorParallelShard& TensorParallelShard::operator=(TensorParallelShard&&) noexcept = default;
TensorParallelShard::~TensorParallelShard() = default;

torch::Tensor TensorParallelShard::slice(const torch::Tensor& whole, int64_t along) const {
  const int64_t p = style.parts;
  if (whole.size(along) % (p * size) != 0)
    throw Error("tensor parallel: size " + std::to_string(whole.size(along)) +
                " is not divisible by " + std::to_string(p) + " x tp " + std::to_string(size));
  std::vector<torch::Tensor> pieces;
  for (const torch::Tensor& block : whole.chunk(p, along))
    pieces.push_back(slice_of(block, rank, size, along));
  return torch::cat(pieces, along);
}

torch::Tensor TensorParallelShard::gather(const torch::Tensor& piece, int64_t along) const {
  torch::NoGradGuard no_grad;
  if (piece.is_meta()) {  // no values (an empty init's module at teardown): the shape only
    std::vector<int64_t> sizes = piece.sizes().vec();
    sizes[along] *= size;
    return torch::empty(sizes, piece.options());
  }
  const torch::Tensor all = all_gather(*group, piece, along);  // [rank 0's, rank 1's, ...]
  const int64_t p = style.parts;
  if (p == 1) return all;
  // Each rank's piece is p blocks; the whole is block 0 of every rank, then block 1, ...
  std::vector<torch::Tensor> blocks;
  const std::vector<torch::Tensor> per_rank = all.chunk(size, along);
  for (int64_t b = 0; b < p; ++b)
    for (const torch::Tensor& r : per_rank) blocks.push_back(r.chunk(p, along)[b]);
  return torch::cat(blocks, along);
}

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits,
                                           const torch::Tensor& targets, int64_t vocab_start,
                                           const ProcessGroupPtr& group) {
  const torch::Tensor z = logits.to(torch::kFloat);
  const int64_t rows = z.size(-1);
  torch::Tensor max;
  {
    torch::NoGradGuard no_grad;
    max = all_reduce(*group, std::get<0>(z.max(-1)), c10d::ReduceOp::MAX);
  }
  const torch::Tensor shifted = z - max.unsqueeze(-1);
  const torch::Tensor sum_exp = reduce_from_parallel(shifted.exp().sum(-1), group);
  const torch::Tensor other = (targets < vocab_start).logical_or(targets >= vocab_start + rows);
  const torch::Tensor local = (targets - vocab_start).masked_fill(other, 0);
  const torch::Tensor target_logit = reduce_from_parallel(
      shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(other, 0.0), group);
  // Targets -100 count nowhere (torch's cross_entropy ignore_index: prompt and padding tokens of
  // instruction data); the mean is over the others.
  const torch::Tensor kept = targets.ne(-100).to(torch::kFloat);
  return ((sum_exp.log() - target_logit) * kept).sum() / kept.sum();
}

}  // namespace fabric::nn
