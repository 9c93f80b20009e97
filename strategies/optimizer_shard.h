// fabric::strategies::OptimizerShard: ZeRO stage 1 (fabric.ddp.shard_optimizer_state): each of
// the N ranks keeps the optimizer state (momentum, Adam moments) of 1/N of the parameters.
//
// Layout: the optimizer's parameters, in its order, are laid end to end (each in its memory
// order, at flat_layout's aligned places) in one flat vector of T elements padded to N·S; rank r
// owns elements
// [r·S, (r+1)·S). At construction the optimizer's parameter groups are rewritten to this rank's
// pieces: 1-D tensors that alias the parameters' own memory (no copy of the weights is kept), so
// the optimizer allocates its state for 1/N of the elements and updates the parameters in place.
// Per optimizer step:
//   reduce_scatter_gradients()  after backward: every gradient ×1/N (the Reducer's factor) into
//                               the flat vector, one reduce-scatter into this rank's S elements,
//                               which become the pieces' .grad; the parameters' own gradients
//                               are released (the next backward makes new ones).
//   the optimizer steps          only this rank's pieces.
//   gather_parameters()         one all-gather of the S updated elements of every rank; each
//                               parameter takes its values.
// The collectives move as many bytes as one all-reduce. Each element is updated by the same
// element-wise rule as under plain DDP, so the trained parameters match DDP's.
//
// Requirements, each a fabric::Error naming the fix when unmet: an element-wise optimizer
// (LibTorch's or fabric's SGD, Adam, AdamW, RMSprop, Adagrad) that has not stepped yet; its
// parameters require gradients, share one dtype and device, are dense in memory, do not share
// memory with each other; every rank owns at least one element; every parameter has a gradient
// after every synchronized backward (unused parameters are not supported).
//
// Checkpoints hold the state in one process's layout (full_state / prepare_full_state), so they
// load at any world size, under plain ddp or single_device, and the other way round.
//
// Segments (fabric.strategy: fsdp, strategies/fsdp.h): a sharding strategy that owns the flat
// memory itself gives several flat vectors (one per unit), each split into N parts of its own S,
// and the memory the pieces alias (this rank's shard of each) and their gradients; the strategy
// then moves gradients and parameters itself, and this class rewrites the optimizer, clips over
// the pieces and saves and loads the state in one process's layout.
#ifndef STRATEGIES_OPTIMIZER_SHARD_H_
#define STRATEGIES_OPTIMIZER_SHARD_H_

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fabric::strategies {

// The flat layout ZeRO-1 and fsdp share: `numels` laid end to end, each starting at a multiple of
// 128 bytes (32 float32 elements) and each rank's part S a multiple of it too, so that every
// rank's piece of a parameter starts at a multiple of 128 bytes of that parameter and ends at
// one or at the parameter's end. CPU kernels (the fused optimizers, TensorIterator's element-wise
// loops) run whole SIMD vectors from a tensor's first element and finish its last elements one at
// a time, and the two paths can round differently; with pieces cut at these places each element
// of a piece takes the path it takes in the whole parameter, so the sharded step is bitwise the
// step of plain ddp (with one intra-op thread; measured on AVX-512 and AVX2 kernels, tests in
// fsdp_test and zero_test). When the aligned S would leave a rank without an element (tiny
// models), the layout is packed (no gaps, S = ⌈T/N⌉) as before. The gaps hold zeros and are never
// stepped (the optimizer holds only the pieces).
struct FlatLayout {
  std::vector<int64_t> offsets;  // each tensor's first element
  int64_t total = 0;             // T: the end of the last tensor
  int64_t shard_size = 0;        // S: each rank's part of the N·S padded elements
};
FlatLayout flat_layout(const std::vector<int64_t>& numels, int64_t element_size, int64_t world);
// Zeros the elements of `flat` (a layout's N·S elements) that no tensor of `tensors` (at
// `offsets`) covers: the gaps and the padding.
void zero_gaps(torch::Tensor& flat, const std::vector<int64_t>& offsets,
               const std::vector<torch::Tensor>& tensors);

class OptimizerShard {
 public:
  // `names`: a name for each tensor of `named` (the module's parameters), used in errors.
  OptimizerShard(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& named,
                 const std::vector<std::string>& names, c10::intrusive_ptr<c10d::ProcessGroup> pg);

  // The flat memory of a strategy that owns it. Segment s has elements[s] elements, split into
  // N parts of S_s = shard_sizes[s] (its flat_layout); `memory[s]` and `grads[s]` are this
  // rank's S_s elements of the values and of the gradients. place(p) names where parameter p (any
  // parameter of the optimizer) lies: {segment, first element}; it throws fabric::Error for a
  // tensor it does not hold.
  struct Segments {
    std::vector<int64_t> elements;
    std::vector<int64_t> shard_sizes;  // each segment's S
    std::vector<torch::Tensor> memory;
    std::vector<torch::Tensor> grads;
    std::function<std::pair<size_t, int64_t>(const torch::Tensor&)> place;
    // Where the process group's collectives take tensors when the memory is elsewhere (fsdp's
    // cpu_offload: host shards, CUDA collectives); nullopt: the memory's device.
    std::optional<torch::Device> collective_device;
  };
  // `key`: the setting named in errors.
  OptimizerShard(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& named,
                 const std::vector<std::string>& names, c10::intrusive_ptr<c10d::ProcessGroup> pg,
                 Segments segments, std::string key);
  ~OptimizerShard();

  const torch::optim::Optimizer& optimizer() const { return optimizer_; }

  // ZeRO-1 only (not with Segments). After backward; collective.
  void reduce_scatter_gradients();
  // ZeRO-1 only. After the optimizer step; collective.
  void gather_parameters();
  // With Segments: the pieces' gradients alias their segments' gradient memory again (after the
  // strategy wrote it; Optimizer::zero_grad may have released them).
  void attach_gradients();
  // Whether the pieces hold gradients (Optimizer::zero_grad(true) releases them).
  bool has_gradients() const;

  // Fabric::clip_gradients over the sharded gradients: the total norm over every rank's pieces
  // (collective), the same coefficient everywhere, as clip_grad_norm_on_device computes it.
  torch::Tensor clip_grad_norm(double max_norm, double norm_type);
  // Tensor parallelism (model_parallel): clip_grad_norm sums over `group` (every rank of the mesh)
  // instead of the shard's group, each parameter's share weighted by weight(parameter): 1 for a
  // parameter split over the tp ranks, 1 / tp for one every tp rank holds whole.
  void set_norm_scope(c10::intrusive_ptr<c10d::ProcessGroup> group,
                      const std::function<double(const torch::Tensor&)>& weight);
  void clip_grad_value(double clip_value);

  // The optimizer state in one process's layout (fabric/checkpoint/optimizer_state.h), each
  // parameter's buffers whole and shaped like it. Collective; every rank gets it.
  c10::IValue full_state();
  // The same layout with each buffer as this rank's piece of it (fabric/checkpoint/sharded.h's
  // tensor_piece; a parameter with no elements on this rank: an empty piece), for sharded
  // checkpoints. No communication.
  c10::IValue local_state() const;
  // The elements of the buffer at `path` ("state/I/FIELD" of that layout) this rank keeps, for
  // loading only them (Strategy::wanted_optimizer_piece); nullopt when `sizes` and `strides` are
  // not the parameter's.
  std::optional<PieceRange> wanted(const std::string& path, at::IntArrayRef sizes,
                                   at::IntArrayRef strides) const;
  // Checks a state in that layout (each buffer whole, or the piece wanted() named) against the
  // parameters and returns what loads this rank's part. Throws fabric::Error "SOURCE: ...";
  // changes nothing.
  std::function<void()> prepare_full_state(const c10::IValue& state, const std::string& source);

  // The parameters' names (the module's), group by group in the optimizer's order.
  std::vector<std::vector<std::string>> names_by_group() const {
    std::vector<std::vector<std::string>> out;
    for (const auto& group : group_params_) {
      out.emplace_back();
      for (size_t i : group) out.back().push_back(names_[i]);
    }
    return out;
  }

  // ZeRO-1 (one segment): its elements and this rank's part.
  int64_t total_elements() const { return totals_.at(0); }
  int64_t shard_elements() const { return shard_sizes_.at(0); }

 private:
  struct Piece {
    size_t param;   // index into params_
    int64_t begin;  // first element, in the parameter's memory order
    int64_t length;
    int64_t shard_offset;  // where it sits in this rank's S elements of its segment
  };

  // The optimizer's parameters, checked, into params_, names_ and group_params_.
  void collect(const std::vector<torch::Tensor>& named, const std::vector<std::string>& names);
  // pieces_ and the optimizer's rewritten groups; `memory[s]`: what segment s's pieces alias
  // (undefined: the parameters' own memory).
  void split(const std::vector<torch::Tensor>& memory);
  torch::Tensor flat_of(size_t param, const torch::Tensor& flat) const;
  // {"type", "state": `state`, "param_groups"}: the optimizer's groups (hyperparameters from
  // `local`, this rank's optimizer_state) with the parameters numbered in one process's order.
  c10::IValue one_process_layout(const c10::impl::GenericDict& local,
                                 const c10::impl::GenericDict& state) const;
  Error error(const std::string& what) const;

  torch::optim::Optimizer& optimizer_;
  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  std::string key_;  // the setting named in errors
  int64_t rank_ = 0;
  int64_t world_ = 1;
  std::vector<torch::Tensor> params_;  // the optimizer's, in its order (groups, then members)
  std::vector<std::string> names_;
  std::vector<size_t> segment_of_;                 // each parameter's segment
  std::vector<int64_t> offsets_;                   // each parameter's first element in its segment
  std::vector<std::vector<size_t>> group_params_;  // the parameters of each group
  std::vector<Piece> pieces_;                      // this rank's, in the optimizer's new order
  std::vector<torch::Tensor> piece_tensors_;
  std::vector<int64_t> totals_;       // each segment's elements
  std::vector<int64_t> shard_sizes_;  // each segment's S
  std::vector<torch::Tensor> grads_;  // each segment's S gradient elements (the pieces' alias)
  std::optional<torch::Device> collective_device_;  // Segments::collective_device
  // Where collectives take tensors: collective_device_, else the gradients' device.
  torch::Device collective_device() const {
    return collective_device_.value_or(grads_.at(0).device());
  }
  c10::intrusive_ptr<c10d::ProcessGroup> norm_pg_;  // set_norm_scope's group (null: pg_)
  std::vector<double> norm_weights_;                // per parameter (empty: all 1)
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_OPTIMIZER_SHARD_H_
