#include "fabric/checkpoint/checkpoint_state.h"

#include <c10/core/GradMode.h>

#include <map>
#include <memory>
#include <sstream>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/error.h"

namespace fabric {
namespace {

using Dict = c10::impl::GenericDict;

c10::IValue field(const c10::IValue& value, const std::string& key, const std::string& source) {
  if (!value.isGenericDict()) throw Error(source + ": malformed (not a dict)");
  const Dict dict = value.toGenericDict();
  auto it = dict.find(key);
  if (it == dict.end()) throw Error(source + ": malformed (no \"" + key + "\")");
  return it->value();
}

int64_t int_field(const c10::IValue& value, const std::string& key, const std::string& source) {
  const auto v = field(value, key, source);
  if (!v.isInt()) throw Error(source + ": malformed (\"" + key + "\" is not an integer)");
  return v.toInt();
}

// `key` of a dict, or `fallback` when the dict has none (checkpoints written before it existed).
int64_t int_field_or(const c10::IValue& value, const std::string& key, int64_t fallback,
                     const std::string& source) {
  if (value.isGenericDict() && value.toGenericDict().find(key) == value.toGenericDict().end())
    return fallback;
  return int_field(value, key, source);
}

std::string kind_error(const std::string& source, const char* expected, const c10::IValue& v) {
  return source + ": holds a " + v.tagKind() + ", expected " + expected;
}

}  // namespace

CheckpointState& CheckpointState::add_entry(Entry entry) {
  if (entry.name.empty()) throw Error("CheckpointState: an entry needs a name");
  for (const auto& e : entries_)
    if (e.name == entry.name) throw Error("CheckpointState: duplicate name \"" + entry.name + "\"");
  entries_.push_back(std::move(entry));
  return *this;
}

void CheckpointState::replace_functions(const std::string& name, std::function<c10::IValue()> save,
                                        decltype(Entry::prepare) prepare) {
  for (auto& e : entries_) {
    if (e.name != name) continue;
    e.save = std::move(save);
    e.prepare = std::move(prepare);
    return;
  }
  throw Error("CheckpointState: no entry \"" + name + "\"");
}

CheckpointState& CheckpointState::add(const std::string& name, torch::nn::Module& module) {
  return add_entry({name, Entry::Kind::kModule, &module,
                    [&module] {
                      c10::Dict<std::string, torch::Tensor> d;
                      for (const auto& [key, t] : state_dict(module)) d.insert(key, t);
                      return c10::IValue(d);
                    },
                    [&module](const c10::IValue& v, const std::string& source) {
                      return prepare_load_state_dict(module, state_dict_from(v, source), source);
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, torch::optim::Optimizer& optimizer) {
  return add_entry({name, Entry::Kind::kOptimizer, &optimizer,
                    [&optimizer] { return optimizer_state(optimizer); },
                    [&optimizer](const c10::IValue& v, const std::string& source) {
                      return prepare_optimizer_state(optimizer, v, source);
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, LRScheduler& scheduler) {
  // {"step", "group_scales", "lr_factor", "best", "has_best", "bad_reports", "cooldown_left"};
  // checkpoints from before parameter groups and plateau hold only "step".
  return add_entry(
      {name, Entry::Kind::kScheduler, &scheduler,
       [&scheduler] {
         const LRScheduler::State s = scheduler.state();
         Dict d = new_dict();
         d.insert("step", s.step);
         // A plain list (a typed double list pickles as a TorchScript call Python's
         // weights_only loader and ours refuse).
         c10::impl::GenericList scales(c10::AnyType::get());
         for (double x : s.group_scales) scales.push_back(x);
         d.insert("group_scales", scales);
         d.insert("lr_factor", s.lr_factor);
         d.insert("best", s.best);
         d.insert("has_best", s.has_best);
         d.insert("bad_reports", s.bad_reports);
         d.insert("cooldown_left", s.cooldown_left);
         return c10::IValue(d);
       },
       [&scheduler](const c10::IValue& v, const std::string& source) {
         LRScheduler::State s = scheduler.state();
         s.step = int_field(v, "step", source);
         const Dict dict = v.toGenericDict();
         auto optional = [&](const char* key) {
           auto it = dict.find(key);
           return it == dict.end() ? c10::IValue() : it->value();
         };
         auto number = [&](const char* key, double fallback) {
           const c10::IValue x = optional(key);
           if (x.isNone()) return fallback;
           if (!x.isDouble() && !x.isInt())
             throw Error(source + ": malformed (\"" + key + "\" is not a number)");
           return x.isDouble() ? x.toDouble() : static_cast<double>(x.toInt());
         };
         if (const c10::IValue scales = optional("group_scales"); !scales.isNone()) {
           if (!scales.isList())
             throw Error(source + ": malformed (\"group_scales\" is not a list of numbers)");
           s.group_scales.clear();
           for (const c10::IValue& x : scales.toListRef()) {
             if (!x.isDouble())
               throw Error(source + ": malformed (\"group_scales\" is not a list of numbers)");
             s.group_scales.push_back(x.toDouble());
           }
         }
         s.lr_factor = number("lr_factor", 1.0);
         s.best = number("best", 0.0);
         s.has_best = optional("has_best").isBool() && optional("has_best").toBool();
         s.bad_reports = static_cast<int64_t>(number("bad_reports", 0));
         s.cooldown_left = static_cast<int64_t>(number("cooldown_left", 0));
         const size_t groups = scheduler.state().group_scales.size();
         if (s.group_scales.size() != groups) {
           throw Error(source + ": holds " + std::to_string(s.group_scales.size()) +
                       " parameter-group ratios, the optimizer has " + std::to_string(groups) +
                       " groups (were optimizer.no_weight_decay or optimizer.lr_scale changed?)");
         }
         return std::function<void()>([&scheduler, s] { scheduler.load_state(s); });
       }});
}

CheckpointState& CheckpointState::add(const std::string& name, GradScaler& scaler) {
  return add_entry(
      {name, Entry::Kind::kScaler, &scaler,
       [&scaler] {
         Dict d = new_dict();
         for (const auto& [key, value] : scaler.state_dict()) d.insert(key, value);
         return c10::IValue(d);
       },
       [&scaler](const c10::IValue& v, const std::string& source) {
         if (!v.isGenericDict()) throw Error(kind_error(source, "a GradScaler state", v));
         std::map<std::string, double> state;
         for (const auto& e : v.toGenericDict()) {
           if (!e.key().isString() || !(e.value().isDouble() || e.value().isInt()))
             throw Error(source + ": malformed GradScaler state");
           state[e.key().toStringRef()] =
               e.value().isInt() ? static_cast<double>(e.value().toInt()) : e.value().toDouble();
         }
         GradScaler check(scaler.options());  // load_state_dict names missing/unexpected keys
         try {
           check.load_state_dict(state);
         } catch (const Error& e) {
           throw Error(source + ": " + e.what());
         }
         return std::function<void()>([&scaler, state] { scaler.load_state_dict(state); });
       }});
}

CheckpointState& CheckpointState::add(const std::string& name, DataLoader& loader) {
  // What fixes the order of the data at `s` (a mid-epoch resume needs them unchanged).
  auto facts = [&loader](const DataLoader::State& s) {
    const auto& o = loader.options();
    std::vector<std::pair<std::string, int64_t>> out{
        {"world size", loader.placement().num_replicas},
        {"batch_size", o.batch_size()},
        {"samples per rank", loader.num_samples()},
        {"shuffle", o.shuffle()},
        {"drop_last", o.drop_last()},
        {"seed", static_cast<int64_t>(o.seed().value_or(0))},
        {"shuffle_buffer", o.shuffle_buffer()}};
    // Streamed loaders: where rank 0's stream stands (shard, byte offset of the next example it
    // reads), so a resume notices shards that were changed, reordered or rewritten since.
    if (o.shuffle_buffer() > 0) {
      const auto [shard, offset] = loader.stream_position(s, 0);
      out.emplace_back("stream_shard", shard);
      out.emplace_back("stream_offset", offset);
    }
    return out;
  };
  return add_entry(
      {name, Entry::Kind::kLoader, &loader,
       [&loader, facts] {
         Dict d = new_dict();
         const auto s = loader.state();
         d.insert("epoch", s.epoch);
         d.insert("batches", s.batches);
         d.insert("batches_per_epoch", loader.size());
         for (const auto& [key, value] : facts(s)) d.insert(key, value);
         return c10::IValue(d);
       },
       [&loader, facts](const c10::IValue& v, const std::string& source) {
         const DataLoader::State s{int_field(v, "epoch", source), int_field(v, "batches", source)};
         const int64_t per_epoch = int_field(v, "batches_per_epoch", source);
         if (s.batches > 0 && s.batches < per_epoch) {
           // Mid-epoch: the rest of the epoch is only the right data in the same order.
           std::string changed;
           for (const auto& [key, now] : facts(s)) {
             // Keys some checkpoints lack: shuffle_buffer (written later; absent means 0) and the
             // stream position (absent when that loader did not stream: shuffle_buffer says so).
             const int64_t was = key == "shuffle_buffer"        ? int_field_or(v, key, 0, source)
                                 : key.rfind("stream_", 0) == 0 ? int_field_or(v, key, now, source)
                                                                : int_field(v, key, source);
             if (was != now)
               changed += (changed.empty() ? "" : ", ") + key + " " + std::to_string(was) + " → " +
                          std::to_string(now);
           }
           if (!changed.empty())
             throw Error(source + ": cannot resume in the middle of epoch " +
                         std::to_string(s.epoch) + " (after batch " + std::to_string(s.batches) +
                         " of " + std::to_string(per_epoch) + "): the data order changed (" +
                         changed +
                         "); resume with the same settings or from an end-of-epoch checkpoint");
         }
         return std::function<void()>([&loader, s] { loader.load_state(s); });
       }});
}

CheckpointState& CheckpointState::add(const std::string& name, int64_t& value) {
  return add_entry({name, Entry::Kind::kValue, nullptr, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isInt()) throw Error(kind_error(source, "an integer", v));
                      return std::function<void()>([&value, x = v.toInt()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, double& value) {
  return add_entry({name, Entry::Kind::kValue, nullptr, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isDouble()) throw Error(kind_error(source, "a number", v));
                      return std::function<void()>([&value, x = v.toDouble()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, bool& value) {
  return add_entry({name, Entry::Kind::kValue, nullptr, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isBool()) throw Error(kind_error(source, "a bool", v));
                      return std::function<void()>([&value, x = v.toBool()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, std::string& value) {
  return add_entry({name, Entry::Kind::kValue, nullptr, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isString()) throw Error(kind_error(source, "a string", v));
                      return std::function<void()>([&value, x = v.toStringRef()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, torch::Tensor& value) {
  return add_entry(
      {name, Entry::Kind::kValue, nullptr,
       [&value] { return value.defined() ? c10::IValue(value.detach()) : c10::IValue(); },
       [&value](const c10::IValue& v, const std::string& source) {
         if (v.isNone()) return std::function<void()>([&value] { value = torch::Tensor(); });
         if (!v.isTensor()) throw Error(kind_error(source, "a tensor", v));
         return std::function<void()>([&value, x = v.toTensor()] {
           value = x.to(value.defined() ? value.device() : torch::Device(torch::kCPU));
         });
       }});
}

CheckpointState& CheckpointState::add_split(const std::string& name, torch::Tensor& part,
                                            std::vector<int64_t> sizes, int64_t offset,
                                            std::function<torch::Tensor()> gather) {
  const auto shape = [](at::IntArrayRef s) { return c10::str(s); };
  Entry entry{
      name, Entry::Kind::kValue, nullptr,
      [&part, sizes, offset] {
        return tensor_piece(sizes, c10::contiguous_strides(sizes), offset, part);
      },
      [&part, sizes, offset, shape](const c10::IValue& v, const std::string& source) {
        const int64_t n = part.numel();
        torch::Tensor from;
        if (auto piece = as_tensor_piece(v)) {
          if (piece->sizes != sizes || piece->offset != offset || piece->values.numel() != n) {
            throw Error(source + ": holds elements " + std::to_string(piece->offset) + " to " +
                        std::to_string(piece->offset + piece->values.numel()) +
                        " of a tensor of shape " + shape(piece->sizes) +
                        "; this rank keeps elements " + std::to_string(offset) + " to " +
                        std::to_string(offset + n) + " of shape " + shape(sizes));
          }
          from = piece->values;
        } else if (v.isTensor()) {
          const torch::Tensor whole = v.toTensor();
          if (!whole.sizes().equals(sizes)) {
            throw Error(source + ": a tensor of shape " + shape(whole.sizes()) + ", expected " +
                        shape(sizes));
          }
          from = whole.contiguous().reshape(-1).narrow(0, offset, n);
        } else {
          throw Error(kind_error(source, "a tensor", v));
        }
        return std::function<void()>([&part, from] {
          c10::NoGradGuard no_grad;
          part.copy_(from);
        });
      }};
  entry.gather = [gather = std::move(gather)] { return c10::IValue(gather()); };
  return add_entry(std::move(entry));
}

}  // namespace fabric
