#include "fabric/checkpoint/format.h"

#include <torch/types.h>
#include <torch/version.h>

#include <chrono>
#include <set>

#include "fabric/checkpoint/archive.h"
#include "fabric/core/build_info.h"
#include "fabric/core/error.h"
#include "fabric/core/suggest.h"

namespace fabric {
namespace {

constexpr int64_t kFormatVersion = 1;
using Dict = c10::impl::GenericDict;

c10::IValue find(const Dict& dict, const std::string& key) {
  auto it = dict.find(key);
  return it == dict.end() ? c10::IValue() : it->value();
}

}  // namespace

c10::IValue checkpoint_contents(const CheckpointMeta& meta, const CheckpointState& state,
                                Stateful* scaler, const std::vector<RngState>& rng_by_rank,
                                const std::vector<c10::impl::GenericDict>& extra_by_rank) {
  Dict fabric = new_dict();
  fabric.insert("format_version", kFormatVersion);
  fabric.insert("libtorch_version", std::string(TORCH_VERSION));
  fabric.insert("revision", build_info().revision);
  fabric.insert("config", meta.config_yaml);
  fabric.insert("config_hash", meta.config_hash);
  fabric.insert("world_size", meta.world_size);
  fabric.insert(
      "saved_unix_time",
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  Dict entries = new_dict();
  for (const auto& e : state.entries()) entries.insert(e.name, e.save());
  c10::impl::GenericList ranks(c10::AnyType::get());
  for (size_t r = 0; r < rng_by_rank.size(); ++r) {
    const RngState& rng = rng_by_rank[r];
    Dict d = new_dict();
    d.insert("cpu", rng.cpu.cpu());
    c10::impl::GenericList cuda(c10::AnyType::get());  // typed lists pickle as code calls
    for (const auto& t : rng.cuda) cuda.push_back(t.cpu().clone());
    d.insert("cuda", cuda);
    if (r < extra_by_rank.size())
      for (const auto& item : extra_by_rank[r]) d.insert(item.key(), item.value());
    ranks.push_back(d);
  }
  Dict top = new_dict();
  top.insert("fabric", fabric);
  top.insert("state", entries);
  if (scaler) top.insert("grad_scaler", scaler->save_state());
  top.insert("rng", ranks);
  return top;
}

PreparedCheckpoint prepare_checkpoint(
    const c10::IValue& contents, const std::string& source, const CheckpointState& state,
    bool strict, Stateful* scaler, int64_t rank,
    const std::function<std::string(const std::string&)>& explain) {
  PreparedCheckpoint out;
  if (!contents.isGenericDict() || find(contents.toGenericDict(), "fabric").isNone())
    throw Error(source +
                ": not a Fabric++ checkpoint (no \"fabric\" entry; for a state dict of weights "
                "use load_weights)");
  const Dict top = contents.toGenericDict();
  const Dict meta = find(top, "fabric").toGenericDict();
  const auto version = find(meta, "format_version");
  if (!version.isInt() || version.toInt() > kFormatVersion)
    throw Error(source + ": checkpoint format " +
                (version.isInt() ? std::to_string(version.toInt()) : "?") +
                " is newer than this build reads (" + std::to_string(kFormatVersion) +
                "); load it with a newer Fabric++");
  if (const auto v = find(meta, "libtorch_version");
      v.isString() && v.toStringRef() != TORCH_VERSION)
    out.warnings.push_back("saved with LibTorch " + v.toStringRef() + ", running " + TORCH_VERSION);
  if (const auto saved = find(meta, "config"); saved.isString())
    out.saved_config = saved.toStringRef();
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
      out.apply.push_back(e.prepare(it->value(), source + ": " + e.name));
    } catch (const Error& err) {
      problems.push_back(err.what());
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& entry : entries)
    if (!known.count(entry.key().toStringRef())) unexpected.push_back(entry.key().toStringRef());
  std::string names;
  if (!missing.empty()) names += "missing [" + join_cut(missing) + "]";
  if (!unexpected.empty())
    names += (names.empty() ? "" : "; ") + std::string("unexpected [") + join_cut(unexpected) + "]";
  if (!names.empty()) {
    if (strict)
      problems.insert(problems.begin(), source + ": entries differ: " + names);
    else
      out.warnings.push_back("entries skipped: " + names);
  }
  if (!problems.empty()) {
    std::string why = join_cut(problems, 3, "; ");
    if (explain && !out.saved_config.empty())
      if (const std::string clause = explain(out.saved_config); !clause.empty()) {
        why += "; " + clause;
        // Entries a key switches on (trainer.ema_decay, callbacks.*) cannot start mid-run.
        if (!names.empty())
          why +=
              "; resume with the checkpoint's values of those keys, or start a new run from "
              "its weights (`ckpt consolidate` writes them for model.init_weights)";
      }
    throw Error(why);
  }
  // The GradScaler of 16-mixed.
  const auto saved_scaler = find(top, "grad_scaler");
  if (scaler && saved_scaler.isGenericDict()) {
    out.apply.push_back(scaler->prepare_restore(saved_scaler, source + ": grad_scaler"));
  } else if (scaler) {
    out.warnings.push_back("no GradScaler state in the file: the loss scale starts afresh");
  }
  // This rank's generator states.
  const auto rng = find(top, "rng");
  const auto ranks = rng.isList() ? rng.toList() : c10::impl::GenericList(c10::AnyType::get());
  if (rank < static_cast<int64_t>(ranks.size())) {
    const Dict mine = ranks.get(rank).toGenericDict();
    out.rank_state = mine;
    RngState s;
    s.cpu = find(mine, "cpu").toTensor();
    for (const auto& t : find(mine, "cuda").toList()) s.cuda.push_back(t.get().toTensor());
    out.apply.push_back([s] { set_rng_state(s); });
  } else {
    out.warnings.push_back("no random generator state for rank " + std::to_string(rank) +
                           " (saved by " + std::to_string(ranks.size()) +
                           " processes): its generators keep their current state");
  }
  return out;
}

}  // namespace fabric
