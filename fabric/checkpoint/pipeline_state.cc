#include "fabric/checkpoint/pipeline_state.h"

#include <torch/types.h>

#include <optional>
#include <utility>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"

namespace fabric {
namespace {

using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

bool is_dict(const c10::IValue& v) { return v.isGenericDict() && !as_tensor_piece(v); }

std::string key_of(const c10::IValue& key) {
  if (key.isString()) return key.toStringRef();
  if (key.isInt()) return std::to_string(key.toInt());
  return "?";
}

c10::IValue empty_piece(const c10::IValue& v) {
  if (auto piece = as_tensor_piece(v))
    return tensor_piece(piece->sizes, piece->strides, piece->offset,
                        torch::empty({0}, piece->values.options().device(torch::kCPU)),
                        piece->layout);
  const torch::Tensor& t = v.toTensor();
  return tensor_piece(t.sizes(), c10::contiguous_strides(t.sizes()), 0,
                      torch::empty({0}, t.options().device(torch::kCPU)));
}

void leaf_paths(const c10::IValue& v, const std::string& at, std::set<std::string>& out) {
  if (!is_dict(v)) {
    out.insert(at);
    return;
  }
  for (const auto& item : v.toGenericDict())
    leaf_paths(item.value(), at + "/" + key_of(item.key()), out);
}

// `v` (at `at`) as stage rank writes it: see PipelineJoin::own_pieces.
c10::IValue own(const c10::IValue& v, const std::string& at, const std::set<std::string>& earlier,
                bool writes) {
  if (is_dict(v)) {
    const Dict dict = v.toGenericDict();
    Dict out(dict.keyType(), dict.valueType());
    for (const auto& item : dict)
      out.insert(item.key(), own(item.value(), at + "/" + key_of(item.key()), earlier, writes));
    return out;
  }
  const bool tensor = v.isTensor() && v.toTensor().defined();
  if (!tensor && !as_tensor_piece(v)) return v;
  if (earlier.count(at)) return empty_piece(v);
  if (!tensor) return v;  // this rank's piece
  const torch::Tensor t = v.toTensor().detach();
  if (!writes) return empty_piece(v);
  return tensor_piece(t.sizes(), c10::contiguous_strides(t.sizes()), 0,
                      t.contiguous().view(-1).cpu());
}

const c10::IValue* find(const Dict& d, const char* key) {
  auto it = d.find(key);
  return it == d.end() ? nullptr : &it->value();
}

std::vector<std::string> strings_of(const c10::IValue& v) {
  std::vector<std::string> out;
  const List list = v.toList();
  for (size_t i = 0; i < list.size(); ++i) out.push_back(list.get(i).toStringRef());
  return out;
}

}  // namespace

c10::IValue with_parameter_names(const c10::IValue& optimizer,
                                 const std::vector<std::vector<std::string>>& names) {
  if (!optimizer.isGenericDict()) return optimizer;
  Dict out = optimizer.toGenericDict().copy();
  List list(c10::StringType::get());
  for (const auto& group : names)
    for (const auto& name : group) list.push_back(name);
  out.insert_or_assign(kParamNamesKey, list);
  return out;
}

c10::IValue pipeline_skeleton(const c10::IValue& value) {
  if (as_tensor_piece(value) || (value.isTensor() && value.toTensor().defined()))
    return empty_piece(value);
  if (!value.isGenericDict()) return value;
  const Dict dict = value.toGenericDict();
  Dict out(dict.keyType(), dict.valueType());
  for (const auto& item : dict) out.insert(item.key(), pipeline_skeleton(item.value()));
  return out;
}

c10::IValue merge_first(const c10::IValue& a, const c10::IValue& b) {
  if (is_dict(a) && is_dict(b)) {
    Dict out = a.toGenericDict().copy();
    for (const auto& item : b.toGenericDict()) {
      auto it = out.find(item.key());
      if (it == out.end())
        out.insert(item.key(), item.value());
      else
        out.insert_or_assign(item.key(), merge_first(it->value(), item.value()));
    }
    return out;
  }
  if (a.isList() && b.isList() && a.toList().size() == b.toList().size()) {
    const auto x = a.toList(), y = b.toList();
    List out(x.elementType());
    for (size_t i = 0; i < x.size(); ++i) out.push_back(merge_first(x.get(i), y.get(i)));
    return out;
  }
  return a;
}

PipelineJoin::PipelineJoin(std::vector<c10::IValue> skeletons,
                           const std::vector<std::string>& optimizers) {
  for (const std::string& entry : optimizers) {
    Numbering n;
    std::optional<size_t> groups;
    std::vector<std::pair<std::vector<std::string>, List>> stages;
    for (const auto& skeleton : skeletons) {
      const c10::IValue* opt = find(skeleton.toGenericDict(), entry.c_str());
      const c10::IValue* names =
          opt && opt->isGenericDict() ? find(opt->toGenericDict(), kParamNamesKey) : nullptr;
      if (names == nullptr) {
        stages.emplace_back(std::vector<std::string>{}, List(c10::AnyType::get()));
        continue;
      }
      const List g = opt->toGenericDict().at("param_groups").toList();
      if (groups && *groups != g.size())
        throw Error("pipeline checkpoint: the stages' optimizers ('" + entry + "') have " +
                    std::to_string(*groups) + " and " + std::to_string(g.size()) +
                    " parameter groups; every stage needs the same groups");
      groups = g.size();
      stages.emplace_back(strings_of(*names), g);
    }
    n.groups.resize(groups.value_or(0));
    for (size_t g = 0; g < n.groups.size(); ++g)
      for (size_t k = 0; k < stages.size(); ++k) {
        if (stages[k].second.size() <= g) continue;
        const auto ids = stages[k].second.get(g).toGenericDict().at("params").toList();
        for (size_t j = 0; j < ids.size(); ++j) {
          const std::string& name = stages[k].first.at(static_cast<size_t>(ids.get(j).toInt()));
          // A parameter two stages hold (a tied embedding) once, where the first holds it.
          if (!n.index.emplace(name, static_cast<int64_t>(n.names.size())).second) continue;
          n.names.push_back(name);
          n.owner[name] = k;
          n.groups[g].push_back(n.index.at(name));
        }
      }
    numbering_[entry] = std::move(n);
  }
  std::set<std::string> before;
  for (size_t k = 0; k < skeletons.size(); ++k) {
    skeletons_.push_back(renumber(skeletons[k], k));
    earlier_.push_back(before);
    leaf_paths(skeletons_.back(), "", before);
  }
}

c10::IValue PipelineJoin::renumber_optimizer(const c10::IValue& optimizer, const Numbering& n,
                                             size_t stage) const {
  if (!optimizer.isGenericDict()) return optimizer;
  const Dict dict = optimizer.toGenericDict();
  const c10::IValue* names_value = find(dict, kParamNamesKey);
  if (names_value == nullptr) return optimizer;
  const std::vector<std::string> names = strings_of(*names_value);
  Dict out(dict.keyType(), dict.valueType());
  for (const auto& item : dict) {
    const std::string key = key_of(item.key());
    if (key == "state") {
      const Dict state = item.value().toGenericDict();
      Dict joined(state.keyType(), state.valueType());
      for (const auto& s : state) {
        const std::string& name = names.at(static_cast<size_t>(s.key().toInt()));
        if (n.owner.at(name) == stage) joined.insert(n.index.at(name), s.value());
      }
      out.insert(item.key(), joined);
    } else if (key == "param_groups") {
      const List groups = item.value().toList();
      List joined(groups.elementType());
      for (size_t g = 0; g < groups.size(); ++g) {
        Dict group = groups.get(g).toGenericDict().copy();
        List ids(c10::AnyType::get());
        for (int64_t i : n.groups.at(g)) ids.push_back(i);
        group.insert_or_assign("params", ids);
        joined.push_back(group);
      }
      out.insert(item.key(), joined);
    } else if (key == kParamNamesKey) {
      List all(c10::StringType::get());
      for (const auto& name : n.names) all.push_back(name);
      out.insert(item.key(), all);
    } else {
      out.insert(item.key(), item.value());
    }
  }
  return out;
}

c10::IValue PipelineJoin::renumber(const c10::IValue& state, size_t stage) const {
  if (!state.isGenericDict()) return state;
  Dict out = state.toGenericDict().copy();
  for (const auto& [entry, n] : numbering_) {
    auto it = out.find(entry);
    if (it != out.end()) out.insert_or_assign(entry, renumber_optimizer(it->value(), n, stage));
  }
  return out;
}

c10::IValue PipelineJoin::own_pieces(const c10::IValue& state, size_t stage, bool writes) const {
  return own(state, "", earlier_.at(stage), writes);
}

c10::IValue PipelineJoin::join_skeletons(const c10::IValue& root) const {
  c10::IValue out = root;
  for (size_t k = 1; k < skeletons_.size(); ++k) out = merge_first(out, skeletons_[k]);
  return out;
}

std::map<std::string, std::vector<std::string>> saved_parameter_names(const c10::IValue& contents,
                                                                      const PipelineLocal& local) {
  std::map<std::string, std::vector<std::string>> out;
  if (!contents.isGenericDict()) return out;
  const c10::IValue* state = find(contents.toGenericDict(), "state");
  if (state == nullptr || !state->isGenericDict()) return out;
  for (const auto& [entry, unused] : local.optimizers) {
    const c10::IValue* opt = find(state->toGenericDict(), entry.c_str());
    if (opt == nullptr || !opt->isGenericDict()) continue;
    const c10::IValue* names = find(opt->toGenericDict(), kParamNamesKey);
    if (names != nullptr && names->isList()) out[entry] = strings_of(*names);
  }
  return out;
}

c10::IValue pipeline_localize(const c10::IValue& contents, const PipelineLocal& local,
                              const std::string& source) {
  if (!contents.isGenericDict()) return contents;
  const Dict top = contents.toGenericDict();
  const c10::IValue* state_value = find(top, "state");
  if (state_value == nullptr || !state_value->isGenericDict()) return contents;
  const auto saved_names = saved_parameter_names(contents, local);
  if (saved_names.empty() && !local.stage_only) return contents;
  const Dict state = state_value->toGenericDict();
  // A stage finds its parameters' optimizer state by name; an optimizer saved without pipeline
  // parallelism numbers them in one process's order, which no stage's matches.
  if (local.stage_only)
    for (const auto& [entry, groups] : local.optimizers)
      if (!saved_names.count(entry) && state.contains(entry))
        throw Error(source + ": the optimizer '" + entry +
                    "' was saved without pipeline parallelism (its state has no \"" +
                    kParamNamesKey +
                    "\" to find a stage's parameters by); resume it at "
                    "fabric.model_parallel.pipeline_parallel_size 1, or resume under pp from a "
                    "checkpoint a pp run wrote");
  Dict out_state(state.keyType(), state.valueType());
  for (const auto& item : state) {
    const std::string entry = key_of(item.key());
    if (local.stage_only && !local.entries.count(entry)) continue;
    c10::IValue v = item.value();
    if (auto names = saved_names.find(entry); names != saved_names.end()) {
      const auto& own = local.optimizers.at(entry);
      const std::string where = source + ": does not match the optimizer '" + entry + "': ";
      const Dict dict = v.toGenericDict();
      const List groups = dict.at("param_groups").toList();
      if (groups.size() != own.size())
        throw Error(where + std::to_string(groups.size()) +
                    " parameter groups saved, the optimizer has " + std::to_string(own.size()));
      std::map<std::string, int64_t> index;
      std::vector<std::vector<int64_t>> ids(own.size());
      for (size_t g = 0; g < own.size(); ++g)
        for (const auto& name : own[g]) {
          ids[g].push_back(static_cast<int64_t>(index.size()));
          index.emplace(name, ids[g].back());
        }
      std::set<std::string> saved(names->second.begin(), names->second.end());
      for (const auto& [name, i] : index)
        if (!saved.count(name))
          throw Error(where + "parameter '" + name + "' is not in the checkpoint");
      Dict out(dict.keyType(), dict.valueType());
      for (const auto& f : dict) {
        const std::string key = key_of(f.key());
        if (key == kParamNamesKey) continue;
        if (key == "state") {
          const Dict s = f.value().toGenericDict();
          Dict mine(c10::IntType::get(), c10::AnyType::get());
          for (const auto& p : s) {
            const int64_t i = p.key().toInt();
            if (i < 0 || i >= static_cast<int64_t>(names->second.size()))
              throw Error(where + "state for parameter " + std::to_string(i) + " of " +
                          std::to_string(names->second.size()) + " named");
            auto at = index.find(names->second[static_cast<size_t>(i)]);
            if (at != index.end()) mine.insert(at->second, p.value());
          }
          out.insert(f.key(), mine);
        } else if (key == "param_groups") {
          List mine(groups.elementType());
          for (size_t g = 0; g < groups.size(); ++g) {
            Dict group = groups.get(g).toGenericDict().copy();
            List l(c10::AnyType::get());
            for (int64_t i : ids[g]) l.push_back(i);
            group.insert_or_assign("params", l);
            mine.push_back(group);
          }
          out.insert(f.key(), mine);
        } else {
          out.insert(f.key(), f.value());
        }
      }
      v = out;
    } else if (local.stage_only && local.modules.count(entry) && v.isGenericDict()) {
      const auto& held = local.modules.at(entry);
      const Dict dict = v.toGenericDict();
      Dict mine(dict.keyType(), dict.valueType());
      for (const auto& t : dict)
        if (held.count(key_of(t.key()))) mine.insert(t.key(), t.value());
      v = mine;
    }
    out_state.insert(item.key(), v);
  }
  Dict out = top.copy();
  out.insert_or_assign("state", out_state);
  return out;
}

}  // namespace fabric
