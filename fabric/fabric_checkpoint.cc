// Fabric's checkpoint side: save, snapshot_for_save (checkpoint.async), load, save_weights and
// load_weights, and how they let the strategy split, gather and read back the state. The rest of
// the facade is in fabric.cc.
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/format.h"
#include "fabric/checkpoint/rng_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/sharded_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/checkpoint/writer.h"
#include "fabric/connector.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"
#include "fabric/fabric.h"
#include "strategies/collectives.h"

namespace fabric {
namespace {

// Every module of `modules` with its full parameters while the guards live (collective: a
// strategy that shards parameters gathers them on every rank).
std::vector<ScopeGuard> materialize_modules(Strategy& strategy,
                                            const std::vector<torch::nn::Module*>& modules,
                                            bool write_back) {
  std::vector<ScopeGuard> guards;
  for (torch::nn::Module* module : modules)
    guards.push_back(strategy.materialize_parameters(*module, write_back));
  return guards;
}

std::vector<torch::nn::Module*> modules_of(const CheckpointState& state) {
  std::vector<torch::nn::Module*> out;
  for (const auto& entry : state.entries())
    if (entry.module) out.push_back(entry.module);
  return out;
}

// A copy of `value` whose tensors are host (CPU) tensors sharing nothing with the original: those
// of `reuse` (an earlier copy) where it has a tensor of the same dtype and shape at the same
// place, new ones elsewhere.
c10::IValue host_copy(const c10::IValue& value, const c10::IValue* reuse) {
  if (value.isTensor()) {
    const at::Tensor& t = value.toTensor();
    if (!t.defined()) return t;
    if (reuse != nullptr && reuse->isTensor()) {
      at::Tensor r = reuse->toTensor();
      if (r.defined() && r.device().is_cpu() && r.scalar_type() == t.scalar_type() &&
          r.sizes().equals(t.sizes()) && r.is_contiguous()) {
        r.copy_(t);
        return r;
      }
    }
    return t.to(torch::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
  }
  if (value.isGenericDict()) {
    const auto dict = value.toGenericDict();
    const bool same = reuse != nullptr && reuse->isGenericDict();
    c10::impl::GenericDict out(dict.keyType(), dict.valueType());
    out.reserve(dict.size());
    for (const auto& item : dict) {
      std::optional<c10::IValue> earlier;
      if (same) {
        const auto old = reuse->toGenericDict();
        if (auto it = old.find(item.key()); it != old.end()) earlier = it->value();
      }
      out.insert(item.key(), host_copy(item.value(), earlier ? &*earlier : nullptr));
    }
    return out;
  }
  if (value.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : value.toTensorVector())
      out.push_back(host_copy(t, nullptr).toTensor());
    return out;
  }
  if (value.isList()) {
    const auto list = value.toList();
    const bool same = reuse != nullptr && reuse->isList() && reuse->toList().size() == list.size();
    c10::impl::GenericList out(list.elementType());
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const c10::IValue earlier = same ? reuse->toList().get(i) : c10::IValue();
      out.push_back(host_copy(list.get(i), same ? &earlier : nullptr));
    }
    return out;
  }
  if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    const bool same = reuse != nullptr && reuse->isTuple() &&
                      reuse->toTupleRef().elements().size() == items.size();
    std::vector<c10::IValue> out;
    for (size_t i = 0; i < items.size(); ++i)
      out.push_back(host_copy(items[i], same ? &reuse->toTupleRef().elements()[i] : nullptr));
    return c10::ivalue::Tuple::create(std::move(out));
  }
  return value;  // strings, numbers, None: immutable
}

}  // namespace

void Fabric::save_weights_of(torch::nn::Module& module, const std::string& path) {
  const auto file = absolute_from_working_directory(path);
  const ScopeGuard whole = strategy_->materialize_parameters(module, /*write_back=*/false);
  // Under pipeline parallelism rank 0 holds the first stage: the others' tensors join it.
  const StateDict all = strategy_->gather_pipeline_state(state_dict(module));
  on_global_zero(*strategy_, [&] { save_state_dict(file, all); });
}

std::function<c10::IValue(const CheckpointState&)> Fabric::gather_for_save() {
  // Every rank's generator states reach every rank (collective, before anything can fail).
  const RngState rng = get_rng_state();
  auto cpu_states = all_gather(rng.cpu.to(device()));
  const auto cuda_flat = rng.cuda.empty() ? torch::empty({0}, torch::kUInt8) : torch::cat(rng.cuda);
  auto cuda_states = all_gather(cuda_flat.to(device()));
  auto cuda_counts =
      all_gather(torch::tensor({static_cast<int64_t>(rng.cuda.size())}).to(device()));
  return [this, cpu_states = std::move(cpu_states), cuda_states = std::move(cuda_states),
          cuda_counts = std::move(cuda_counts)](const CheckpointState& contents) {
    std::vector<RngState> by_rank(cpu_states.size());
    for (size_t r = 0; r < cpu_states.size(); ++r) {
      by_rank[r].cpu = cpu_states[r].cpu();
      const int64_t n = cuda_counts[r].item<int64_t>();
      if (n > 0) by_rank[r].cuda = cuda_states[r].cpu().chunk(n);
    }
    return checkpoint_contents({config_.to_yaml(), config_.hash(), world_size()}, contents,
                               precision().scaler(), by_rank);
  };
}

bool Fabric::saves_sharded() const {
  const std::string& format = setup_->checkpoint_format;
  if (format == "sharded") return true;
  const ShardedState* sharded = strategy_->sharded_state();
  return format == "auto" && sharded != nullptr;
}

void Fabric::save(const std::string& path, const CheckpointState& state) {
  const PhaseScope phase(*this, Phase::kSave);
  const auto file = absolute_from_working_directory(path);
  const auto contents_of = gather_for_save();
  if (saves_sharded()) {
    // Each rank writes what it holds: nothing gathered.
    const CheckpointState contents = with_local_pieces(strategy_->sharded_state(), state);
    StrategyRanks ranks(*strategy_);
    write_sharded_checkpoint(ranks, file, [&] { return contents_of(contents); });
    for (const auto& c : callbacks_) c->on_save_checkpoint(*this, file.string());
    return;
  }
  // Optimizers the strategy splits over the ranks: gathered now, on every rank (collective);
  // modules whose parameters it splits: whole until written.
  const CheckpointState contents =
      with_whole_splits(with_split_optimizers(strategy_->sharded_state(), state, /*gather=*/true));
  const std::vector<ScopeGuard> whole = materialize_modules(*strategy_, modules_of(state), false);
  StrategyRanks ranks(*strategy_);  // they hold the same state: rank 0 writes
  write_checkpoint_file(ranks, file, [&] { return contents_of(contents); });
  for (const auto& c : callbacks_) c->on_save_checkpoint(*this, file.string());
}

std::function<void()> Fabric::snapshot_for_save(const std::string& path,
                                                const CheckpointState& state,
                                                std::shared_ptr<c10::IValue>& snapshot) {
  const PhaseScope phase(*this, Phase::kSave);
  const auto file = absolute_from_working_directory(path);
  const auto contents_of = gather_for_save();
  if (saves_sharded()) {
    const CheckpointState contents = with_local_pieces(strategy_->sharded_state(), state);
    snapshot = std::make_shared<c10::IValue>(host_copy(contents_of(contents), snapshot.get()));
    StrategyRanks ranks(*strategy_);
    return sharded_checkpoint_writer(ranks, file, snapshot, setup_->ddp.timeout);
  }
  const CheckpointState contents =
      with_whole_splits(with_split_optimizers(strategy_->sharded_state(), state, /*gather=*/true));
  const std::vector<ScopeGuard> whole = materialize_modules(*strategy_, modules_of(state), false);
  if (!is_global_zero()) {
    snapshot.reset();
    return {};
  }
  // A copy, so that training may change the state while the file is written.
  snapshot = std::make_shared<c10::IValue>(host_copy(contents_of(contents), snapshot.get()));
  return [file, taken = snapshot] { save_archive(file, *taken); };
}

void Fabric::load(const std::string& path, CheckpointState& state, bool strict) {
  const PhaseScope phase(*this, Phase::kLoad);
  const auto file = absolute_from_working_directory(path);
  const std::string source = file.string();
  PreparedCheckpoint prepared;
  std::string failure;
  // The modules loaded whole (gathered while written) rather than in this rank's part.
  auto whole_modules = std::make_shared<std::vector<torch::nn::Module*>>();
  try {
    // A sharded checkpoint: this rank reads only its part of what the strategy splits.
    prepared = prepare_checkpoint(
        read_checkpoint(
            file, {wanted_pieces(strategy_->sharded_state(), state), global_rank(), world_size()}),
        source,
        with_local_loaders(
            strategy_->sharded_state(),
            with_split_optimizers(strategy_->sharded_state(), state, /*gather=*/false),
            whole_modules),
        strict, precision().scaler(), global_rank());
    if (!prepared.saved_config.empty()) {
      const auto diff =
          config_differences(prepared.saved_config, config_.to_yaml(), {"checkpoint", "logging"});
      if (!diff.empty()) prepared.warnings.push_back("the config differs: " + join(diff, "; "));
    }
  } catch (const Error& e) {
    failure = e.what();
  } catch (const std::exception& e) {  // a value of an unexpected type: a damaged or foreign file
    std::string why = e.what();
    failure = source + ": malformed checkpoint (" + why.substr(0, why.find('\n')) + ")";
  }
  // All ranks fail together (and with rank 0's reason when theirs read fine).
  const bool ok_everywhere = all_reduce(failure.empty() ? 1.0 : 0.0, ReduceOp::kMin) > 0.5;
  if (!ok_everywhere) {
    const std::string first = broadcast(failure, 0);
    throw Error(!failure.empty()
                    ? failure
                    : (!first.empty()
                           ? first
                           : source + ": could not be loaded on another rank (see its log)"));
  }
  {
    const std::vector<ScopeGuard> whole = materialize_modules(*strategy_, *whole_modules, true);
    for (auto& fn : prepared.apply) fn();
  }
  if (is_global_zero())
    for (const auto& w : prepared.warnings)
      std::cerr << "warning: " << source << ": " << w << std::endl;
  for (const auto& c : callbacks_) c->on_load_checkpoint(*this, source);
}

void Fabric::load_weights_of(torch::nn::Module& module, const std::string& path) {
  const auto file = absolute_from_working_directory(path);
  // A .safetensors file is memory-mapped: each rank then reads only where its elements lie.
  load_weights_of(module, load_state_dict_file(file), file.string());
}

void Fabric::load_weights_of(torch::nn::Module& module, const StateDict& tensors,
                             const std::string& source, const KeepName& keep) {
  // A module of an empty init not yet set up: its tensors are on the meta device, and a copy
  // into them would be lost.
  for (const auto& record : pending_inits_) {
    bool made = false;
    for (const auto& p : module.parameters()) made = made || record->made(p);
    for (const auto& b : module.buffers()) made = made || record->made(b);
    if (made)
      throw Error(source +
                  ": the module was built by an empty init (init_module) and has no memory "
                  "until setup(); load its weights after setup");
  }
  // With names kept the module is loaded whole (below): a sharded checkpoint's pieces of the
  // kept tensors are what each rank writes, not all that it holds.
  ShardedState* sharded = keep ? nullptr : strategy_->sharded_state();
  if (sharded != nullptr) {
    // Each rank copies the elements it keeps straight from `tensors` (views: a memory-mapped
    // file is read only where this rank's elements lie).
    c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, tensor] : tensors) {
      if (value.contains(name)) throw Error(source + ": tensor " + name + " is given twice");
      value.insert(name, tensor);
    }
    if (auto load = sharded->prepare_local_module_state(module, value, source)) {
      (*load)();
      return;
    }
  }
  // Whole parameters on every rank (a strategy that shards them gathers them while copied).
  const ScopeGuard whole = strategy_->materialize_parameters(module, /*write_back=*/true);
  if (!keep) {
    load_state_dict(module, tensors, source);
    return;
  }
  StateDict all = tensors;
  std::set<std::string> given;
  for (const auto& entry : tensors) given.insert(entry.first);
  for (const auto& [name, tensor] : state_dict(module))
    if (!given.count(name) && keep(name)) all.emplace_back(name, tensor.detach().clone());
  load_state_dict(module, all, source);
}

}  // namespace fabric
