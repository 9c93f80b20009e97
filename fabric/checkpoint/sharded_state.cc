// How Fabric::save and Fabric::load route a CheckpointState through a ShardedState (each
// function's contract is in sharded_state.h).
#include "fabric/checkpoint/sharded_state.h"

#include <tuple>
#include <utility>
#include <vector>

namespace fabric {

CheckpointState with_split_optimizers(ShardedState* sharded, const CheckpointState& state,
                                      bool gather) {
  if (!sharded) return state;
  CheckpointState out = state;
  for (const auto& entry : state.entries()) {
    if (!entry.optimizer) continue;
    auto& optimizer = *entry.optimizer;
    auto prepare = [sharded, &optimizer, own = entry.prepare](const c10::IValue& value,
                                                              const std::string& source) {
      auto split = sharded->prepare_split_optimizer_state(optimizer, value, source);
      return split ? *split : own(value, source);
    };
    if (!gather) {
      out.replace_functions(entry.name, entry.save, prepare);
      continue;
    }
    std::optional<c10::IValue> full = sharded->gather_optimizer_state(optimizer);
    if (full)
      out.replace_functions(
          entry.name, [full] { return *full; }, prepare);
  }
  return out;
}

CheckpointState with_whole_splits(const CheckpointState& state) {
  CheckpointState out = state;
  for (const auto& entry : state.entries()) {
    if (!entry.gather) continue;
    const c10::IValue whole = entry.gather();
    out.replace_functions(
        entry.name, [whole] { return whole; }, entry.prepare);
  }
  return out;
}

CheckpointState with_local_pieces(ShardedState* sharded, const CheckpointState& state) {
  if (!sharded) return state;
  CheckpointState out = state;
  for (const auto& entry : state.entries()) {
    std::optional<c10::IValue> local;
    if (entry.module) {
      local = sharded->local_module_state(*entry.module);
      if (local) local = kept_state(*entry.module, entry.keep, *local, /*for_load=*/false);
    } else if (entry.optimizer)
      local = sharded->local_optimizer_state(*entry.optimizer);
    if (local)
      out.replace_functions(
          entry.name, [local] { return *local; }, entry.prepare);
  }
  return out;
}

WantedPieces wanted_pieces(ShardedState* sharded, const CheckpointState& state) {
  if (!sharded) return nullptr;
  std::vector<std::tuple<std::string, torch::nn::Module*, torch::optim::Optimizer*>> places;
  for (const auto& entry : state.entries())
    if (entry.module || entry.optimizer)
      places.emplace_back(sharded_path({"state", entry.name}) + "/", entry.module, entry.optimizer);
  return [sharded, places](const std::string& path, at::IntArrayRef sizes, at::IntArrayRef strides,
                           const std::optional<PieceLayout>& layout) -> std::optional<PieceRange> {
    for (const auto& [prefix, module, optimizer] : places) {
      if (path.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string inside = path.substr(prefix.size());
      if (module) return sharded->wanted_module_piece(*module, inside, sizes, strides, layout);
      return sharded->wanted_optimizer_piece(*optimizer, inside, sizes, strides, layout);
    }
    return std::nullopt;
  };
}

CheckpointState with_local_loaders(ShardedState* sharded, const CheckpointState& state,
                                   std::shared_ptr<std::vector<torch::nn::Module*>> whole) {
  CheckpointState out = state;
  for (const auto& entry : state.entries()) {
    if (!entry.module) continue;
    auto& module = *entry.module;
    out.replace_functions(
        entry.name, entry.save,
        [sharded, &module, whole, keep = entry.keep, own = entry.prepare](
            const c10::IValue& value, const std::string& source) {
          // Under `keep` the names it rejects are left as they are where the value lacks them.
          if (sharded)
            if (auto local = sharded->prepare_local_module_state(
                    module, kept_state(module, keep, value, /*for_load=*/true), source))
              return *local;
          whole->push_back(&module);
          return own(value, source);
        });
  }
  return out;
}

}  // namespace fabric
