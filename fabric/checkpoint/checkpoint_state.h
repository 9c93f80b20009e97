// fabric::CheckpointState: what Fabric::save and Fabric::load read and write, by name.
//
// Entries refer to the caller's objects (which must outlive the CheckpointState): modules,
// optimizers (SGD, Adam, AdamW, RMSprop, Adagrad), Stateful objects (fabric/core/stateful.h: data
// loaders with their position inside the epoch, LR schedulers, GradScalers, objects of yours), and
// plain values (int64_t, double, bool, std::string, torch::Tensor). Saving reads them; loading
// checks every entry first and changes nothing unless all of them fit, then writes them back
// (modules and optimizer buffers on their current devices; tensors keep the device of the tensor
// they replace, CPU if it was undefined).
//
// Example:
//   fabric::CheckpointState state;
//   state.add("model", model).add("optimizer", *optimizer).add("scheduler", scheduler)
//        .add("train_loader", train).add("best_accuracy", best);
//   f.save("ckpt/last.ckpt", state);   ...   f.load("ckpt/last.ckpt", state);
#ifndef FABRIC_CHECKPOINT_CHECKPOINT_STATE_H_
#define FABRIC_CHECKPOINT_CHECKPOINT_STATE_H_

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fabric/checkpoint/piece_layout.h"
#include "fabric/core/stateful.h"

namespace fabric {

class CheckpointState {
 public:
  // Each add() throws fabric::Error for an empty or duplicate name.
  CheckpointState& add(const std::string& name, torch::nn::Module& module);
  template <typename Impl>
  CheckpointState& add(const std::string& name, torch::nn::ModuleHolder<Impl>& module) {
    return add(name, static_cast<torch::nn::Module&>(*module));
  }
  // Only the tensors of `module` whose names `keep` accepts: saved alone (sharded checkpoints
  // hold each strategy's pieces of them, one-file checkpoints whole tensors); loaded, the module's
  // other tensors are left as they are where the checkpoint lacks them (a checkpoint of the whole
  // module loads too). trainable_only(module) keeps what trains (a LoRA run's adapters, which
  // every strategy names the same: the checkpoint resumes under another one).
  using KeepName = std::function<bool(const std::string&)>;
  CheckpointState& add(const std::string& name, torch::nn::Module& module, KeepName keep);
  template <typename Impl>
  CheckpointState& add(const std::string& name, torch::nn::ModuleHolder<Impl>& module,
                       KeepName keep) {
    return add(name, static_cast<torch::nn::Module&>(*module), std::move(keep));
  }
  CheckpointState& add(const std::string& name, torch::optim::Optimizer& optimizer);
  // DataLoader, LRScheduler, GradScaler, or an object of yours.
  CheckpointState& add(const std::string& name, Stateful& object);
  CheckpointState& add(const std::string& name, int64_t& value);
  CheckpointState& add(const std::string& name, double& value);
  CheckpointState& add(const std::string& name, bool& value);
  CheckpointState& add(const std::string& name, std::string& value);
  CheckpointState& add(const std::string& name, torch::Tensor& value);
  // A tensor split over the ranks (fabric/training/parameter_parts.h): this rank holds `part`,
  // elements [offset, offset + part.numel()) of a contiguous tensor of `sizes`. A sharded
  // checkpoint stores the part as this rank's piece; a one-file checkpoint stores the whole
  // tensor, joined by `gather` (collective: Fabric::save calls it on every rank before writing).
  // Loading copies this rank's elements into `part` (in place) from the whole tensor or from
  // its piece, so the checkpoint loads at any world size and under any strategy.
  // With `layout`, `offset` counts in its order (piece_layout.h). `written` false: another rank
  // holds the same elements and writes them to sharded checkpoints (this one loads them).
  CheckpointState& add_split(const std::string& name, torch::Tensor& part,
                             std::vector<int64_t> sizes, int64_t offset,
                             std::function<torch::Tensor()> gather,
                             std::optional<PieceLayout> layout = std::nullopt, bool written = true);

  // For Fabric::save / load.
  struct Entry {
    std::string name;
    std::function<c10::IValue()> save;
    // Checks a saved value (throws fabric::Error "SOURCE: ...") and returns what applies it.
    std::function<std::function<void()>(const c10::IValue&, const std::string& source)> prepare;
    // Split entries (add_split) only: the whole value, for one-file checkpoints (collective).
    std::function<c10::IValue()> gather = {};
    // What the entry refers to: at most one is set (none for plain values and splits). Strategies
    // save and load modules and optimizers their own way (sharded state).
    torch::nn::Module* module = nullptr;
    KeepName keep = {};  // modules: the names saved (null: all)
    torch::optim::Optimizer* optimizer = nullptr;
    Stateful* stateful = nullptr;
  };

  const std::vector<Entry>& entries() const { return entries_; }
  // The entry named `name` saves and loads through `save` and `prepare` instead (Fabric::save and
  // Fabric::load use it for optimizers a strategy splits over the ranks). Throws fabric::Error
  // for an unknown name.
  void replace_functions(const std::string& name, std::function<c10::IValue()> save,
                         decltype(Entry::prepare) prepare);
  bool empty() const { return entries_.empty(); }

 private:
  CheckpointState& add_entry(Entry entry);
  std::vector<Entry> entries_;
};

// The names of `module`'s parameters that require gradients now (the filter of its entry when
// only what trains is checkpointed).
CheckpointState::KeepName trainable_only(const torch::nn::Module& module);

// A module entry's state dict (name -> tensor or piece) under its `keep`: for saving
// (`for_load` false) only the names `keep` accepts; for loading the dict with None for each of
// the module's names that `keep` rejects and the dict lacks (prepare_load_state_dict leaves those
// as they are: every strategy's loader gets them so). `value` itself without `keep` or when it is
// not a dict.
c10::IValue kept_state(const torch::nn::Module& module, const CheckpointState::KeepName& keep,
                       const c10::IValue& value, bool for_load);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_CHECKPOINT_STATE_H_
