#include "fabric/checkpoint/checkpoint_state.h"

#include <c10/core/GradMode.h>

#include <memory>
#include <set>
#include <string>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/error.h"

namespace fabric {
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
  Entry entry{name};
  entry.module = &module;
  entry.save = [&module] {
    c10::Dict<std::string, torch::Tensor> d;
    for (const auto& [key, t] : state_dict(module)) d.insert(key, t);
    return c10::IValue(d);
  };
  entry.prepare = [&module](const c10::IValue& v, const std::string& source) {
    return prepare_load_state_dict(module, state_dict_from(v, source), source);
  };
  return add_entry(std::move(entry));
}

CheckpointState& CheckpointState::add(const std::string& name, torch::nn::Module& module,
                                      KeepName keep) {
  if (!keep) return add(name, module);
  Entry entry{name};
  entry.module = &module;
  entry.keep = keep;
  entry.save = [&module, keep] {
    c10::Dict<std::string, torch::Tensor> d;
    for (const auto& [key, t] : state_dict(module))
      if (keep(key)) d.insert(key, t);
    return c10::IValue(d);
  };
  entry.prepare = [&module, keep](const c10::IValue& v, const std::string& source) {
    state_dict_from(v, source);  // the check of a state dict's type, with its message
    return prepare_load_state_dict(module, kept_state(module, keep, v, /*for_load=*/true), source,
                                   {});
  };
  return add_entry(std::move(entry));
}

CheckpointState::KeepName trainable_only(const torch::nn::Module& module) {
  auto names = std::make_shared<std::set<std::string>>();
  for (const auto& p : module.named_parameters())
    if (p.value().requires_grad()) names->insert(p.key());
  return [names](const std::string& name) { return names->count(name) > 0; };
}

c10::IValue kept_state(const torch::nn::Module& module, const CheckpointState::KeepName& keep,
                       const c10::IValue& value, bool for_load) {
  if (!keep || !value.isGenericDict()) return value;
  const auto dict = value.toGenericDict();
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : dict)
    if (for_load || !item.key().isString() || keep(item.key().toStringRef()))
      out.insert(item.key(), item.value());
  if (!for_load) return out;
  auto leave = [&](const std::string& name) {
    if (!keep(name) && !out.contains(name)) out.insert(name, c10::IValue());
  };
  for (const auto& p : module.named_parameters()) leave(p.key());
  for (const auto& b : module.named_buffers()) leave(b.key());
  return out;
}

CheckpointState& CheckpointState::add(const std::string& name, torch::optim::Optimizer& optimizer) {
  Entry entry{name};
  entry.optimizer = &optimizer;
  entry.save = [&optimizer] { return optimizer_state(optimizer); };
  entry.prepare = [&optimizer](const c10::IValue& v, const std::string& source) {
    return prepare_optimizer_state(optimizer, v, source);
  };
  return add_entry(std::move(entry));
}

CheckpointState& CheckpointState::add(const std::string& name, Stateful& object) {
  Entry entry{name};
  entry.stateful = &object;
  entry.save = [&object] { return object.save_state(); };
  entry.prepare = [&object](const c10::IValue& v, const std::string& source) {
    return object.prepare_restore(v, source);
  };
  return add_entry(std::move(entry));
}

CheckpointState& CheckpointState::add(const std::string& name, int64_t& value) {
  return add_entry({name, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isInt()) throw Error(state_type_error(source, "an integer", v));
                      return std::function<void()>([&value, x = v.toInt()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, double& value) {
  return add_entry({name, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isDouble()) throw Error(state_type_error(source, "a number", v));
                      return std::function<void()>([&value, x = v.toDouble()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, bool& value) {
  return add_entry({name, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isBool()) throw Error(state_type_error(source, "a bool", v));
                      return std::function<void()>([&value, x = v.toBool()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, std::string& value) {
  return add_entry({name, [&value] { return c10::IValue(value); },
                    [&value](const c10::IValue& v, const std::string& source) {
                      if (!v.isString()) throw Error(state_type_error(source, "a string", v));
                      return std::function<void()>([&value, x = v.toStringRef()] { value = x; });
                    }});
}

CheckpointState& CheckpointState::add(const std::string& name, torch::Tensor& value) {
  return add_entry(
      {name, [&value] { return value.defined() ? c10::IValue(value.detach()) : c10::IValue(); },
       [&value](const c10::IValue& v, const std::string& source) {
         if (v.isNone()) return std::function<void()>([&value] { value = torch::Tensor(); });
         if (!v.isTensor()) throw Error(state_type_error(source, "a tensor", v));
         return std::function<void()>([&value, x = v.toTensor()] {
           value = x.to(value.defined() ? value.device() : torch::Device(torch::kCPU));
         });
       }});
}

CheckpointState& CheckpointState::add_split(const std::string& name, torch::Tensor& part,
                                            std::vector<int64_t> sizes, int64_t offset,
                                            std::function<torch::Tensor()> gather,
                                            std::optional<PieceLayout> layout, bool written) {
  const auto shape = [](at::IntArrayRef s) { return c10::str(s); };
  Entry entry{
      name,
      [&part, sizes, offset, layout, written] {
        return tensor_piece(sizes, c10::contiguous_strides(sizes), offset,
                            written ? part : part.new_empty({0}), layout);
      },
      [&part, sizes, offset, shape, layout](const c10::IValue& v, const std::string& source) {
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
          from = (layout ? to_layout_order(whole, *layout) : whole.contiguous().reshape(-1))
                     .narrow(0, offset, n);
        } else {
          throw Error(state_type_error(source, "a tensor", v));
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
