// fabric::ShardedState: what a strategy that splits state over the ranks tells the checkpoint
// (Strategy::sharded_state(); null for strategies whose ranks hold the same state). Fsdp's
// parameter shards, ZeRO's optimizer pieces and model_parallel's slices implement it. With it,
// Fabric::save writes a sharded folder (checkpoint.format auto) in which each rank holds its
// pieces, and Fabric::load reads into each rank only the elements it keeps, from a folder cut for
// any world size or from one file.
//
// Every function answers for one module or optimizer; nullopt means "not split by me: save and
// load it whole" (the defaults).
#ifndef FABRIC_CHECKPOINT_SHARDED_STATE_H_
#define FABRIC_CHECKPOINT_SHARDED_STATE_H_

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/checkpoint/sharded.h"

namespace fabric {

class ShardedState {
 public:
  virtual ~ShardedState() = default;

  // Saving a sharded folder. `module`'s state (parameters and buffers by name), each parameter
  // split over the ranks replaced by this rank's piece (tensor_piece). No communication.
  virtual std::optional<c10::IValue> local_module_state(torch::nn::Module& module) {
    (void)module;
    return std::nullopt;
  }
  // A split optimizer's state in one process's layout (optimizer_state.h) with this rank's piece
  // of every buffer. No communication.
  virtual std::optional<c10::IValue> local_optimizer_state(torch::optim::Optimizer& optimizer) {
    (void)optimizer;
    return std::nullopt;
  }

  // Saving one file: a split optimizer's whole state in one process's layout, on every rank
  // (collective: Fabric::save calls it on every rank before writing), so the file loads at any
  // world size and under any strategy. (Split modules are gathered through
  // Strategy::materialize_parameters.)
  virtual std::optional<c10::IValue> gather_optimizer_state(torch::optim::Optimizer& optimizer) {
    (void)optimizer;
    return std::nullopt;
  }

  // The names of a split optimizer's parameters in one process's layout, group by group (the
  // module's names for them): a pipeline stage's checkpoint numbers its optimizer by them
  // (pipeline_state.h).
  virtual std::optional<std::vector<std::vector<std::string>>> optimizer_parameter_names(
      const torch::optim::Optimizer& optimizer) {
    (void)optimizer;
    return std::nullopt;
  }

  // Loading without gathering. Which elements of a split tensor of `module`'s state (`path`: the
  // parameter's name as sharded_path writes it) or of `optimizer`'s (one process's layout:
  // "state/I/FIELD") this rank keeps, given the tensor's shape, strides and layout in the
  // checkpoint (offsets in the layout's order): read_checkpoint then reads just those (a piece).
  virtual std::optional<PieceRange> wanted_module_piece(const torch::nn::Module& module,
                                                        const std::string& path,
                                                        at::IntArrayRef sizes,
                                                        at::IntArrayRef strides,
                                                        const std::optional<PieceLayout>& layout) {
    (void)module, (void)path, (void)sizes, (void)strides, (void)layout;
    return std::nullopt;
  }
  virtual std::optional<PieceRange> wanted_optimizer_piece(
      const torch::optim::Optimizer& optimizer, const std::string& path, at::IntArrayRef sizes,
      at::IntArrayRef strides, const std::optional<PieceLayout>& layout) {
    (void)optimizer, (void)path, (void)sizes, (void)strides, (void)layout;
    return std::nullopt;
  }
  // What loads `module`'s state `value` (name → tensor whole, or the piece wanted_module_piece
  // named) straight into this rank's part of the parameters; nullopt: Fabric gathers the module
  // (Strategy::materialize_parameters) and loads it whole. Throws fabric::Error "SOURCE: ..." as
  // load_state_dict does; changes nothing.
  virtual std::optional<std::function<void()>> prepare_local_module_state(
      torch::nn::Module& module, const c10::IValue& value, const std::string& source) {
    (void)module, (void)value, (void)source;
    return std::nullopt;
  }
  // What loads this rank's part of a split optimizer's state in one process's layout (each
  // buffer whole, or the piece wanted_optimizer_piece named). Throws fabric::Error "SOURCE: ..."
  // and changes nothing.
  virtual std::optional<std::function<void()>> prepare_split_optimizer_state(
      torch::optim::Optimizer& optimizer, const c10::IValue& state, const std::string& source) {
    (void)optimizer, (void)state, (void)source;
    return std::nullopt;
  }
};

// A CheckpointState as Fabric::save / load use it under `sharded` (null: a strategy whose ranks
// hold the same state; each function then leaves the state as it is).

// `state` with each optimizer that `sharded` splits saved and loaded in one process's layout
// (gather_optimizer_state). `gather`: for saving; gathers now, on every rank (collective).
// Otherwise for loading (no communication).
CheckpointState with_split_optimizers(ShardedState* sharded, const CheckpointState& state,
                                      bool gather);
// `state` with each split entry (CheckpointState::add_split) saved whole: gathered now, on every
// rank (collective, in entry order).
CheckpointState with_whole_splits(const CheckpointState& state);
// `state` with each module and optimizer that `sharded` splits saved as this rank's pieces
// (sharded checkpoints; no communication).
CheckpointState with_local_pieces(ShardedState* sharded, const CheckpointState& state);
// The pieces of the split tensors this rank reads from a sharded checkpoint
// (wanted_module_piece, wanted_optimizer_piece), by where `state`'s entries lie in it
// ("state/NAME/...", format.h); null when `sharded` is.
WantedPieces wanted_pieces(ShardedState* sharded, const CheckpointState& state);
// `state` with each module that `sharded` can load without gathering loaded so
// (prepare_local_module_state); the others are added to `whole` when prepared (Fabric then loads
// them with their parameters materialized).
CheckpointState with_local_loaders(ShardedState* sharded, const CheckpointState& state,
                                   std::shared_ptr<std::vector<torch::nn::Module*>> whole);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_SHARDED_STATE_H_
