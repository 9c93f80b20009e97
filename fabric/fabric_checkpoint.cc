// Fabric's checkpoint side: save, snapshot_for_save (checkpoint.async), load, save_weights and
// load_weights, and how they let the strategy split, gather and read back the state. The rest of
// the facade is in fabric.cc.
#include <torch/types.h>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/format.h"
#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/pipeline_state.h"
#include "fabric/checkpoint/rng_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/sharded_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/checkpoint/writer.h"
#include "fabric/connector.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"
#include "fabric/fabric.h"
#include "fabric/fp8_checkpoint.h"
#include "fabric/nn/fp8.h"
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

// A module of an empty init not yet set up: its tensors are on the meta device, and a copy into
// them would be lost (setup then replays the random init: the run would "resume" from scratch).
void refuse_pending_init(const std::vector<std::shared_ptr<InitRecord>>& pending,
                         const torch::nn::Module& module, const std::string& source,
                         const std::string& what) {
  for (const auto& record : pending) {
    bool made = false;
    for (const auto& p : module.parameters()) made = made || record->made(p);
    for (const auto& b : module.buffers()) made = made || record->made(b);
    if (made)
      throw Error(source + ": the module" + what +
                  " was built by an empty init (init_module) and has no memory until setup(); "
                  "load after setup");
  }
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

// The names of each optimizer entry's parameters, group by group in its order: the strategy's for
// an optimizer it splits, else the names the state's modules give its tensors.
std::map<std::string, std::vector<std::vector<std::string>>> optimizer_names(
    Strategy& strategy, const CheckpointState& state) {
  std::unordered_map<const void*, std::string> by_impl;
  for (const auto& entry : state.entries())
    if (entry.module)
      for (const auto& p : entry.module->named_parameters())
        by_impl.emplace(p.value().unsafeGetTensorImpl(), p.key());
  std::map<std::string, std::vector<std::vector<std::string>>> out;
  for (const auto& entry : state.entries()) {
    if (!entry.optimizer) continue;
    if (ShardedState* sharded = strategy.sharded_state())
      if (auto names = sharded->optimizer_parameter_names(*entry.optimizer)) {
        out[entry.name] = std::move(*names);
        continue;
      }
    auto& groups = out[entry.name];
    size_t i = 0;
    for (const auto& group : entry.optimizer->param_groups()) {
      groups.emplace_back();
      for (const auto& p : group.params()) {
        auto it = by_impl.find(p.unsafeGetTensorImpl());
        groups.back().push_back(it != by_impl.end() ? it->second
                                                    : "optimizer parameter #" + std::to_string(i));
        ++i;
      }
    }
  }
  return out;
}

// Under pipeline parallelism (pipeline_state.h): this rank's checkpoint dict `value` as the whole
// model's. Collective over the pipeline. `sharded`: what this rank writes into a sharded folder
// (the pipeline's first rank: every stage's descriptors); otherwise the pipeline's first rank gets
// every stage's state joined (the others their own).
c10::IValue pipeline_contents(Strategy& strategy, const c10::IValue& value,
                              const CheckpointState& state, bool sharded) {
  using Dict = c10::impl::GenericDict;
  const size_t stage = static_cast<size_t>(strategy.pipeline_group()->getRank());
  Dict top = value.toGenericDict().copy();
  Dict entries = top.at("state").toGenericDict().copy();
  std::vector<std::string> optimizers;
  for (const auto& [entry, names] : optimizer_names(strategy, state)) {
    auto it = entries.find(entry);
    if (it == entries.end()) continue;
    entries.insert_or_assign(entry, with_parameter_names(it->value(), names));
    optimizers.push_back(entry);
  }
  const PipelineJoin join(strategy.exchange_pipeline(pipeline_skeleton(entries), true), optimizers);
  c10::IValue mine = join.renumber(entries, stage);
  if (sharded) {
    mine = stage == 0 ? join.join_skeletons(mine)
                      : join.own_pieces(mine, stage, strategy.first_of_stage());
  } else {
    const auto all = strategy.exchange_pipeline(host_copy(mine, nullptr), false);
    for (size_t k = 1; k < all.size(); ++k) mine = merge_first(mine, all[k]);
  }
  top.insert_or_assign("state", mine);
  return top;
}

// What Fabric::load needs to fit a checkpoint to this process (pipeline_state.h).
PipelineLocal pipeline_local(Strategy& strategy, const CheckpointState& state) {
  PipelineLocal local;
  local.stage_only = static_cast<bool>(strategy.pipeline_group());
  local.optimizers = optimizer_names(strategy, state);
  for (const auto& entry : state.entries()) {
    local.entries.insert(entry.name);
    if (!entry.module) continue;
    auto& held = local.modules[entry.name];
    for (const auto& p : entry.module->named_parameters()) held.insert(p.key());
    for (const auto& b : entry.module->named_buffers()) held.insert(b.key());
  }
  return local;
}

// `inner` (the strategy's pieces) for a checkpoint whose optimizers `saved` names (pipeline
// stages'): each buffer asked for at this process's own index of its parameter; under pipeline
// parallelism nothing of the tensors this process does not hold (an empty piece).
WantedPieces pipeline_wanted(
    WantedPieces inner, const PipelineLocal& local,
    std::shared_ptr<std::map<std::string, std::vector<std::string>>> saved) {
  if (!inner && !local.stage_only) return inner;
  std::map<std::string, std::string> entry_of;  // by its escaped name
  for (const auto& e : local.entries) entry_of[sharded_path({e})] = e;
  std::map<std::string, std::map<std::string, int64_t>> own;  // optimizer → name → index
  for (const auto& [entry, groups] : local.optimizers) {
    int64_t i = 0;
    for (const auto& group : groups)
      for (const auto& name : group) own[entry].emplace(name, i++);
  }
  std::map<std::string, std::set<std::string>> held;  // module → escaped names
  for (const auto& [entry, names] : local.modules)
    for (const auto& n : names) held[entry].insert(sharded_path({n}));
  const bool stage_only = local.stage_only;
  return [inner, saved, entry_of, own, held, stage_only](
             const std::string& path, at::IntArrayRef sizes, at::IntArrayRef strides,
             const std::optional<PieceLayout>& layout) -> std::optional<PieceRange> {
    const PieceRange none{0, 0, {}, std::nullopt};
    auto ask = [&](const std::string& p) {
      return inner ? inner(p, sizes, strides, layout) : std::optional<PieceRange>();
    };
    if (path.rfind("state/", 0) != 0) return ask(path);
    const size_t end = path.find('/', 6);
    const std::string escaped = path.substr(6, end == std::string::npos ? end : end - 6);
    auto e = entry_of.find(escaped);
    if (e == entry_of.end()) return stage_only ? std::optional<PieceRange>(none) : ask(path);
    const std::string rest = end == std::string::npos ? "" : path.substr(end + 1);
    auto names = saved->find(e->second);
    if (names != saved->end() && rest.rfind("state/", 0) == 0) {
      const size_t cut = rest.find('/', 6);
      const std::string index = rest.substr(6, cut == std::string::npos ? cut : cut - 6);
      const int64_t i = std::stoll(index);
      if (i < 0 || i >= static_cast<int64_t>(names->second.size())) return ask(path);
      const auto& mine = own.at(e->second);
      auto at = mine.find(names->second[static_cast<size_t>(i)]);
      if (at == mine.end()) return none;
      return ask("state/" + escaped + "/state/" + std::to_string(at->second) +
                 (cut == std::string::npos ? "" : rest.substr(cut)));
    }
    if (stage_only) {
      auto h = held.find(e->second);
      if (h != held.end() && !h->second.count(rest)) return none;
    }
    return ask(path);
  };
}

// Optimizer options the config now sets otherwise than the saver's (optimizer.momentum 0.9 ->
// 0.5 on resume) are the config's: a checkpoint's param_groups would replace them silently
// (torch.optim's load_state_dict does). Returns the functions that put the live values back after
// the load; a line in prepared.warnings names them. The learning rate is the scheduler's (it
// follows optimizer.lr); per-group scales stay the checkpoint's, and a line says so.
std::vector<std::function<void()>> config_optimizer_options(PreparedCheckpoint& prepared,
                                                            const CheckpointState& state,
                                                            const std::string& config_yaml) {
  std::vector<std::function<void()>> keep;
  if (prepared.saved_config.empty()) return keep;
  std::map<std::string, std::string> before, now;
  try {
    before = config_leaves(prepared.saved_config);
    now = config_leaves(config_yaml);
  } catch (const Error&) {
    return keep;
  }
  auto changed = [&](const std::string& key) {
    const auto a = before.find(key), b = now.find(key);
    return a != before.end() && b != now.end() && a->second != b->second;
  };
  std::set<std::string> fields, kept;
  for (const char* field : {"momentum", "dampening", "nesterov", "weight_decay", "betas", "eps",
                            "amsgrad", "alpha", "centered"})
    if (changed(std::string("optimizer.") + field)) fields.insert(field);
  if (!fields.empty())
    for (const auto& e : state.entries())
      if (e.optimizer) keep.push_back(keep_option_fields(*e.optimizer, fields, &kept));
  std::vector<std::string> applied;  // only what an optimizer here has (SGD has no betas)
  for (const auto& field : kept)
    applied.push_back("optimizer." + field + " " + now.at("optimizer." + field));
  if (!applied.empty())
    prepared.warnings.push_back("the config's " + join(applied, ", ") +
                                " replaced the checkpoint's in every parameter group");
  for (const char* key : {"optimizer.lr_scale", "optimizer.no_weight_decay"})
    if (changed(key))
      prepared.warnings.push_back(std::string(key) +
                                  ": the checkpoint's parameter groups and their rates are kept "
                                  "(a change takes a new run, e.g. from exported weights with "
                                  "model.init_weights)");
  return keep;
}

}  // namespace

void Fabric::save_weights_of(torch::nn::Module& module, const std::string& path) {
  const auto file = absolute_from_working_directory(path);
  const ScopeGuard whole = strategy_->materialize_parameters(module, /*write_back=*/false);
  // Under pipeline parallelism rank 0 holds the first stage: the others' tensors join it.
  const StateDict all = strategy_->gather_pipeline_state(state_dict(module));
  on_global_zero(*strategy_, [&] { save_state_dict(file, all); });
}

bool Fabric::delayed_fp8() const {
  return setup_->precision == PrecisionMode::kFp8Mixed && setup_->fp8_amax_history > 0;
}

std::function<c10::IValue(const CheckpointState&)> Fabric::gather_for_save(
    const CheckpointState& state) {
  // Every rank's generator states reach every rank (collective, before anything can fail), and
  // so do its amax histories under delayed scaling (the same recipe on every rank).
  std::vector<c10::impl::GenericDict> fp8 =
      delayed_fp8() ? internal::gather_fp8_histories(*strategy_, device(), state)
                    : std::vector<c10::impl::GenericDict>{};
  const RngState rng = get_rng_state();
  auto cpu_states = all_gather(rng.cpu.to(device()));
  const auto cuda_flat = rng.cuda.empty() ? torch::empty({0}, torch::kUInt8) : torch::cat(rng.cuda);
  auto cuda_states = all_gather(cuda_flat.to(device()));
  auto cuda_counts =
      all_gather(torch::tensor({static_cast<int64_t>(rng.cuda.size())}).to(device()));
  return [this, cpu_states = std::move(cpu_states), cuda_states = std::move(cuda_states),
          cuda_counts = std::move(cuda_counts),
          fp8 = std::move(fp8)](const CheckpointState& contents) {
    std::vector<RngState> by_rank(cpu_states.size());
    for (size_t r = 0; r < cpu_states.size(); ++r) {
      by_rank[r].cpu = cpu_states[r].cpu();
      const int64_t n = cuda_counts[r].item<int64_t>();
      if (n > 0) by_rank[r].cuda = cuda_states[r].cpu().chunk(n);
    }
    return checkpoint_contents({config_.to_yaml(), config_.hash(), world_size()}, contents,
                               precision().scaler(), by_rank, fp8);
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
  const auto contents_of = gather_for_save(state);
  if (saves_sharded()) {
    // Each rank writes what it holds: nothing gathered.
    const CheckpointState contents = with_local_pieces(strategy_->sharded_state(), state);
    StrategyRanks ranks(*strategy_);
    if (strategy_->pipeline_group()) {
      const c10::IValue value = pipeline_contents(*strategy_, contents_of(contents), state, true);
      write_sharded_checkpoint(ranks, file, [&] { return value; });
    } else {
      write_sharded_checkpoint(ranks, file, [&] { return contents_of(contents); });
    }
    for (const auto& c : callbacks_) c->on_save_checkpoint(*this, file.string());
    return;
  }
  // Optimizers the strategy splits over the ranks: gathered now, on every rank (collective);
  // modules whose parameters it splits: whole until written.
  const CheckpointState contents =
      with_whole_splits(with_split_optimizers(strategy_->sharded_state(), state, /*gather=*/true));
  const std::vector<ScopeGuard> whole = materialize_modules(*strategy_, modules_of(state), false);
  StrategyRanks ranks(*strategy_);    // they hold the same state: rank 0 writes
  if (strategy_->pipeline_group()) {  // every stage's joined on rank 0
    const c10::IValue value = pipeline_contents(*strategy_, contents_of(contents), state, false);
    write_checkpoint_file(ranks, file, [&] { return value; });
  } else {
    write_checkpoint_file(ranks, file, [&] { return contents_of(contents); });
  }
  for (const auto& c : callbacks_) c->on_save_checkpoint(*this, file.string());
}

std::function<void()> Fabric::snapshot_for_save(const std::string& path,
                                                const CheckpointState& state,
                                                std::shared_ptr<c10::IValue>& snapshot) {
  const PhaseScope phase(*this, Phase::kSave);
  const auto file = absolute_from_working_directory(path);
  const auto contents_of = gather_for_save(state);
  if (saves_sharded()) {
    const CheckpointState contents = with_local_pieces(strategy_->sharded_state(), state);
    const c10::IValue value =
        strategy_->pipeline_group()
            ? pipeline_contents(*strategy_, contents_of(contents), state, true)
            : contents_of(contents);
    snapshot = std::make_shared<c10::IValue>(host_copy(value, snapshot.get()));
    StrategyRanks ranks(*strategy_);
    return sharded_checkpoint_writer(ranks, file, snapshot, setup_->ddp.timeout);
  }
  const CheckpointState contents =
      with_whole_splits(with_split_optimizers(strategy_->sharded_state(), state, /*gather=*/true));
  const std::vector<ScopeGuard> whole = materialize_modules(*strategy_, modules_of(state), false);
  std::optional<c10::IValue> joined;  // under pipeline parallelism: collective
  if (strategy_->pipeline_group())
    joined = pipeline_contents(*strategy_, contents_of(contents), state, false);
  if (!is_global_zero()) {
    snapshot.reset();
    return {};
  }
  // A copy, so that training may change the state while the file is written.
  snapshot = std::make_shared<c10::IValue>(
      host_copy(joined ? *joined : contents_of(contents), snapshot.get()));
  return [file, taken = snapshot] { save_archive(file, *taken); };
}

namespace {

// Loading writes weights (some through their data pointers): the float8 casts kept of them
// (fabric/nn/fp8.h) go when it ends, however it ends.
ScopeGuard release_fp8_weights_after() {
  return ScopeGuard([] { fabric::nn::release_fp8_weights(); });
}

}  // namespace

void Fabric::load(const std::string& path, CheckpointState& state, bool strict) {
  const PhaseScope phase(*this, Phase::kLoad);
  const ScopeGuard casts = release_fp8_weights_after();
  const auto file = absolute_from_working_directory(path);
  const std::string source = file.string();
  for (const auto& entry : state.entries())
    if (entry.module)
      refuse_pending_init(pending_inits_, *entry.module, source, " of entry '" + entry.name + "'");
  PreparedCheckpoint prepared;
  std::string failure;
  bool unreadable = false;  // `failure` is a damaged file's (load_archive's UnreadableArchive)
  // The modules loaded whole (gathered while written) rather than in this rank's part.
  auto whole_modules = std::make_shared<std::vector<torch::nn::Module*>>();
  // The keys whose values differ from the saver's recorded config (run bookkeeping left out).
  auto config_diff = [&](const std::string& saved) {
    return config_differences(saved, config_.to_yaml(), {"checkpoint", "logging"});
  };
  try {
    // A sharded checkpoint: this rank reads only its part of what the strategy splits. A
    // checkpoint of pipeline stages (its optimizers numbered by name) is fitted to this process;
    // a stage reads only its own tensors.
    const PipelineLocal local = pipeline_local(*strategy_, state);
    auto saved = std::make_shared<std::map<std::string, std::vector<std::string>>>();
    ReadOptions options{
        pipeline_wanted(wanted_pieces(strategy_->sharded_state(), state), local, saved),
        global_rank(), world_size()};
    options.on_common = [&](const c10::IValue& common) {
      *saved = saved_parameter_names(common, local);
    };
    prepared = prepare_checkpoint(
        pipeline_localize(read_checkpoint(file, options), local, source), source,
        with_local_loaders(
            strategy_->sharded_state(),
            with_split_optimizers(strategy_->sharded_state(), state, /*gather=*/false),
            whole_modules),
        strict, precision().scaler(), global_rank(), [&](const std::string& saved) {
          // What differs from the saver's config (finetune.method, a rank, the model's sizes)
          // usually says why an entry or a shape does not fit.
          std::vector<std::string> diff;
          try {
            diff = config_diff(saved);
          } catch (const Error&) {
            return std::string();  // a saved config that is not YAML explains nothing
          }
          if (diff.empty()) return std::string();
          const size_t shown = std::min<size_t>(diff.size(), 4);
          std::string clause = "the config differs from the checkpoint's: ";
          for (size_t i = 0; i < shown; ++i) clause += (i ? "; " : "") + diff[i];
          if (diff.size() > shown)
            clause += "; ... (" + std::to_string(diff.size() - shown) + " more)";
          return clause;
        });
    if (delayed_fp8()) internal::prepare_fp8_histories(prepared, state, global_rank());
    if (!prepared.saved_config.empty()) {
      const auto diff = config_diff(prepared.saved_config);
      if (!diff.empty()) prepared.warnings.push_back("the config differs: " + join(diff, "; "));
    }
  } catch (const UnreadableArchive& e) {
    failure = e.what();
    unreadable = true;
  } catch (const Error& e) {
    failure = e.what();
  } catch (const std::exception& e) {  // a value of an unexpected type: a damaged or foreign file
    std::string why = e.what();
    failure = source + ": malformed checkpoint (" + why.substr(0, why.find('\n')) + ")";
  }
  // All ranks fail together (and with rank 0's reason when theirs read fine).
  const bool ok_everywhere = all_reduce(failure.empty() ? 1.0 : 0.0, ReduceOp::kMin) > 0.5;
  if (!ok_everywhere) {
    // The lowest failing rank's reason (a shard only rank 3 reads may be the damaged one), its
    // first character saying whether a damaged file was (U) or not (E).
    const auto world = static_cast<double>(world_size());
    const auto src = static_cast<int64_t>(
        all_reduce(failure.empty() ? world : static_cast<double>(global_rank()), ReduceOp::kMin));
    const std::string first = broadcast((unreadable ? "U" : "E") + failure, src);
    if (failure.empty()) {
      failure = first.size() > 1 ? first.substr(1)
                                 : source + ": could not be loaded on rank " + std::to_string(src) +
                                       " (see its log)";
      unreadable = first.size() > 1 && first[0] == 'U';
    }
    if (unreadable) throw UnreadableArchive(failure);
    throw Error(failure);
  }
  const std::vector<std::function<void()>> keep_options =
      config_optimizer_options(prepared, state, config_.to_yaml());
  {
    const std::vector<ScopeGuard> whole = materialize_modules(*strategy_, *whole_modules, true);
    for (auto& fn : prepared.apply) fn();
    for (auto& fn : keep_options) fn();
  }
  // Rank 0 prints its warnings; another rank prints those rank 0 did not have (its own: no
  // generator states, no amax histories for it), named by rank, into its own log.
  std::string joined;
  for (const auto& w : prepared.warnings) joined += w + '\n';
  std::set<std::string> zeros;
  {
    std::istringstream lines(world_size() > 1 ? broadcast(joined, 0) : joined);
    for (std::string line; std::getline(lines, line);) zeros.insert(line);
  }
  for (const auto& w : prepared.warnings)
    if (is_global_zero())
      std::cerr << "warning: " << source << ": " << w << std::endl;
    else if (!zeros.count(w))
      std::cerr << "warning: rank " << global_rank() << ": " << source << ": " << w << std::endl;
  for (const auto& c : callbacks_) c->on_load_checkpoint(*this, source);
}

void Fabric::load_weights_of(torch::nn::Module& module, const std::string& path) {
  const PhaseScope phase(*this, Phase::kLoad);
  const auto file = absolute_from_working_directory(path);
  // A .safetensors file is memory-mapped: each rank then reads only where its elements lie.
  load_weights_of(module, load_state_dict_file(file), file.string());
}

void Fabric::load_weights_of(torch::nn::Module& module, const StateDict& tensors,
                             const std::string& source, const KeepName& keep) {
  const PhaseScope phase(*this, Phase::kLoad);
  const ScopeGuard casts = release_fp8_weights_after();
  refuse_pending_init(pending_inits_, module, source, "");
  ShardedState* sharded = strategy_->sharded_state();
  if (sharded != nullptr) {
    // Each rank copies the elements it keeps straight from `tensors` (views: a memory-mapped
    // file is read only where this rank's elements lie); a kept name `tensors` lacks is given
    // None, which leaves it as it is (a LoRA model's adapters): nothing is gathered.
    c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [name, tensor] : tensors) {
      if (value.contains(name)) throw Error(source + ": tensor " + name + " is given twice");
      value.insert(name, tensor);
    }
    // kept_state's filter names what a checkpoint holds; `keep` here what `tensors` may lack.
    const c10::IValue given =
        keep ? kept_state(
                   module, [&keep](const std::string& name) { return !keep(name); }, value,
                   /*for_load=*/true)
             : c10::IValue(value);
    if (auto load = sharded->prepare_local_module_state(module, given, source)) {
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
