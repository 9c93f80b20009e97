// Fabric::save and Fabric::load: checkpoint files (format below) written by global rank 0 and read
// by every rank.
//
// Format version 1: a torch.save archive (fabric/checkpoint/archive.h) holding the dict
//   {"fabric": {"format_version": 1, "libtorch_version", "revision", "config" (resolved YAML),
//               "config_hash", "world_size", "saved_unix_time"},
//    "state": {entry name → entry value (fabric/checkpoint_state.h)},
//    "grad_scaler": {...} (16-mixed only),
//    "rng": [{"cpu": uint8 tensor, "cuda": [uint8 tensor per device]} for each global rank]}
#include <torch/torch.h>
#include <torch/version.h>

#include <chrono>
#include <set>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/rng_state.h"
#include "fabric/core/build_info.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"
#include "fabric/fabric.h"

namespace fabric {
namespace {

constexpr int64_t kFormatVersion = 1;
using Dict = c10::impl::GenericDict;

Dict new_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }

c10::IValue find(const Dict& dict, const std::string& key) {
  auto it = dict.find(key);
  return it == dict.end() ? c10::IValue() : it->value();
}

}  // namespace

void Fabric::save(const std::string& path, const CheckpointState& state) {
  const auto file = absolute_from_working_directory(path);
  // Every rank's generator states reach rank 0 (collective, before anything can fail).
  const RngState rng = get_rng_state();
  const auto cpu_states = all_gather(rng.cpu.to(device()));
  const auto cuda_flat = rng.cuda.empty() ? torch::empty({0}, torch::kUInt8) : torch::cat(rng.cuda);
  const auto cuda_states = all_gather(cuda_flat.to(device()));
  const auto cuda_counts =
      all_gather(torch::tensor({static_cast<int64_t>(rng.cuda.size())}).to(device()));
  std::string failure;
  if (is_global_zero()) {
    try {
      Dict meta = new_dict();
      meta.insert("format_version", kFormatVersion);
      meta.insert("libtorch_version", std::string(TORCH_VERSION));
      meta.insert("revision", build_info().revision);
      meta.insert("config", config_.to_yaml());
      meta.insert("config_hash", config_.hash());
      meta.insert("world_size", world_size());
      meta.insert("saved_unix_time",
                  std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                      .count());
      Dict entries = new_dict();
      for (const auto& e : state.entries()) entries.insert(e.name, e.save());
      c10::impl::GenericList ranks(c10::AnyType::get());
      for (size_t r = 0; r < cpu_states.size(); ++r) {
        Dict d = new_dict();
        d.insert("cpu", cpu_states[r].cpu());
        c10::impl::GenericList cuda(c10::AnyType::get());  // typed lists pickle as code calls
        const int64_t n = cuda_counts[r].item<int64_t>();
        if (n > 0)
          for (const auto& t : cuda_states[r].cpu().chunk(n)) cuda.push_back(t.clone());
        d.insert("cuda", cuda);
        ranks.push_back(d);
      }
      Dict top = new_dict();
      top.insert("fabric", meta);
      top.insert("state", entries);
      if (GradScaler* scaler = precision().scaler())
        top.insert("grad_scaler",
                   CheckpointState().add("grad_scaler", *scaler).entries()[0].save());
      top.insert("rng", ranks);
      save_archive(file, top);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // Every rank learns whether rank 0 succeeded (no rank waits forever for a failed writer).
  failure = broadcast(failure, 0);
  if (!failure.empty()) throw Error(failure);
}

void Fabric::load(const std::string& path, CheckpointState& state, bool strict) {
  const auto file = absolute_from_working_directory(path);
  const std::string source = file.string();
  std::vector<std::string> warnings;
  std::vector<std::function<void()>> apply;
  std::string failure;
  try {
    const c10::IValue loaded = load_archive(file);
    if (!loaded.isGenericDict() || find(loaded.toGenericDict(), "fabric").isNone())
      throw Error(source +
                  ": not a Fabric++ checkpoint (no \"fabric\" entry; for a state dict of weights "
                  "use load_weights)");
    const Dict top = loaded.toGenericDict();
    const Dict meta = find(top, "fabric").toGenericDict();
    const auto version = find(meta, "format_version");
    if (!version.isInt() || version.toInt() > kFormatVersion)
      throw Error(source + ": checkpoint format " +
                  (version.isInt() ? std::to_string(version.toInt()) : "?") +
                  " is newer than this build reads (" + std::to_string(kFormatVersion) +
                  "); load it with a newer Fabric++");
    if (const auto v = find(meta, "libtorch_version");
        v.isString() && v.toStringRef() != TORCH_VERSION)
      warnings.push_back("saved with LibTorch " + v.toStringRef() + ", running " + TORCH_VERSION);
    if (const auto saved = find(meta, "config"); saved.isString()) {
      const auto diff =
          config_differences(saved.toStringRef(), config_.to_yaml(), {"checkpoint", "logging"});
      if (!diff.empty()) warnings.push_back("the config differs: " + join(diff, "; "));
    }
    // Entries: all checked first, then applied (nothing changes unless everything fits).
    const Dict entries = find(top, "state").toGenericDict();
    std::set<std::string> known;
    std::vector<std::string> problems, missing;
    for (const auto& e : state.entries()) {
      known.insert(e.name);
      auto it = entries.find(e.name);
      if (it == entries.end()) {
        missing.push_back(e.name);
        continue;
      }
      try {
        apply.push_back(e.prepare(it->value(), source + ": " + e.name));
      } catch (const Error& err) {
        problems.push_back(err.what());
      }
    }
    std::vector<std::string> unexpected;
    for (const auto& entry : entries)
      if (!known.count(entry.key().toStringRef())) unexpected.push_back(entry.key().toStringRef());
    std::string names;
    if (!missing.empty()) names += "missing [" + join(missing, ", ") + "]";
    if (!unexpected.empty())
      names +=
          (names.empty() ? "" : "; ") + std::string("unexpected [") + join(unexpected, ", ") + "]";
    if (!names.empty()) {
      if (strict)
        problems.insert(problems.begin(), source + ": entries differ: " + names);
      else
        warnings.push_back("entries skipped: " + names);
    }
    if (!problems.empty()) throw Error(join(problems, "; "));
    // The GradScaler of 16-mixed.
    GradScaler* scaler = precision().scaler();
    const auto saved_scaler = find(top, "grad_scaler");
    if (scaler && saved_scaler.isGenericDict()) {
      apply.push_back(CheckpointState()
                          .add("grad_scaler", *scaler)
                          .entries()[0]
                          .prepare(saved_scaler, source + ": grad_scaler"));
    } else if (scaler) {
      warnings.push_back("no GradScaler state in the file: the loss scale starts afresh");
    }
    // This rank's generator states.
    const auto rng = find(top, "rng");
    const auto ranks = rng.isList() ? rng.toList() : c10::impl::GenericList(c10::AnyType::get());
    if (global_rank() < static_cast<int64_t>(ranks.size())) {
      const Dict mine = ranks.get(global_rank()).toGenericDict();
      RngState s;
      s.cpu = find(mine, "cpu").toTensor();
      for (const auto& t : find(mine, "cuda").toList()) s.cuda.push_back(t.get().toTensor());
      apply.push_back([s] { set_rng_state(s); });
    } else {
      warnings.push_back("no random generator state for rank " + std::to_string(global_rank()) +
                         " (saved by " + std::to_string(ranks.size()) +
                         " processes): its generators keep their current state");
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
  for (auto& fn : apply) fn();
  if (is_global_zero())
    for (const auto& w : warnings) std::cerr << "warning: " << source << ": " << w << std::endl;
}

}  // namespace fabric
