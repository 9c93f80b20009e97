#include "fabric/checkpoint/state_dict.h"

#include <torch/types.h>

#include <map>
#include <sstream>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/core/suggest.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

std::string shape_of(at::IntArrayRef sizes) {
  std::ostringstream s;
  s << sizes;
  return s.str();
}

}  // namespace

StateDict state_dict(const torch::nn::Module& module) {
  StateDict out;
  for (const auto& p : module.named_parameters())
    if (p.value().defined()) out.emplace_back(p.key(), p.value().detach());
  for (const auto& b : module.named_buffers())
    if (b.value().defined()) out.emplace_back(b.key(), b.value().detach());
  return out;
}

void save_state_dict(const fs::path& path, const StateDict& tensors) {
  if (path.extension() == ".safetensors") return save_safetensors(path, tensors);
  c10::Dict<std::string, torch::Tensor> dict;
  for (const auto& [name, t] : tensors) {
    if (dict.contains(name))
      throw Error("cannot write " + path.string() + ": duplicate name " + name);
    dict.insert(name, t.detach());
  }
  save_archive(path, c10::IValue(dict));
}

StateDict state_dict_from(const c10::IValue& value, const std::string& source) {
  if (!value.isGenericDict())
    throw Error(source + ": not a state dict (holds a " + value.tagKind() + ", not a dict)");
  StateDict out;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString() || !entry.value().isTensor())
      throw Error(source + ": not a state dict (an entry is not name → tensor)");
    out.emplace_back(entry.key().toStringRef(), entry.value().toTensor());
  }
  return out;
}

StateDict map_names(StateDict tensors,
                    const std::function<std::string(const std::string&)>& rename) {
  StateDict out;
  std::map<std::string, std::string> from;  // new name → the name it came from
  for (auto& [name, t] : tensors) {
    std::string to = rename(name);
    if (to.empty()) continue;
    if (const auto [it, fresh] = from.emplace(to, name); !fresh)
      throw Error("map_names: '" + it->second + "' and '" + name + "' both map to '" + to + "'");
    out.emplace_back(std::move(to), std::move(t));
  }
  return out;
}

StateDict load_state_dict_file(const fs::path& path) {
  if (is_safetensors_file(path)) return load_safetensors(path).tensors;
  return state_dict_from(load_archive(path), path.string());
}

namespace {

// The check and copy of both prepare_load_state_dict overloads: `given` by name (tensors, or
// pieces for the names of `partial`).
std::function<void()> prepare_load(const torch::nn::Module& module,
                                   std::map<std::string, c10::IValue> given,
                                   const std::string& source,
                                   const std::map<std::string, PartialTarget>& partial) {
  std::vector<std::string> missing, shapes;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (destination, source)
  std::vector<std::function<void()>> partial_copies;
  // The module's tensors as they are, not state_dict's detached views: detach is an operator, and
  // under fsdp the first operator that takes a sharded parameter gathers its unit (an all-gather
  // of the whole unit, strategies/sharded_parameters.h); a load that writes each rank's part must
  // read only shapes and dtypes here. (The copies run under NoGradGuard.)
  StateDict targets;
  for (const auto& p : module.named_parameters())
    if (p.value().defined()) targets.emplace_back(p.key(), p.value());
  for (const auto& b : module.named_buffers())
    if (b.value().defined()) targets.emplace_back(b.key(), b.value());
  for (const auto& [name, target] : targets) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    if (it->second.isNone()) {  // left as it is (CheckpointState::add's `keep`)
      given.erase(it);
      continue;
    }
    const auto split = partial.find(name);
    const auto piece = split != partial.end() ? as_tensor_piece(it->second) : std::nullopt;
    if (!piece && !it->second.isTensor())
      throw Error(source + ": not a state dict (" + name + " is not a tensor)");
    const std::vector<int64_t> sizes = piece ? piece->sizes : it->second.toTensor().sizes().vec();
    const at::ScalarType given_type =
        piece ? (piece->values.defined() ? piece->values.scalar_type() : target.scalar_type())
              : it->second.toTensor().scalar_type();
    if (!target.sizes().equals(sizes)) {
      shapes.push_back("shape of " + name + " is " + shape_of(sizes) + " in the file, " +
                       shape_of(target.sizes()) + " in the model");
    } else if (target.is_floating_point() && !at::isFloatingType(given_type) &&
               !at::isComplexType(given_type)) {
      // Integers copied by value into floating parameters train from nonsense (a NaN loss
      // from the first step); floating dtypes convert as torch's load_state_dict does.
      shapes.push_back(name + " is " + std::string(c10::toString(given_type)) +
                       " in the file, a floating-point " +
                       std::string(c10::toString(target.scalar_type())) +
                       " in the model (not weights of this model?)");
    } else if (split != partial.end()) {
      try {
        partial_copies.push_back(split->second(it->second));
      } catch (const Error& e) {
        throw Error(source + ": " + name + ": " + e.what());
      }
    } else {
      copies.emplace_back(target, it->second.toTensor());
    }
    given.erase(it);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : given) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !shapes.empty()) {
    std::string why;
    // Each list cut after 8 names: another model's checkpoint would name hundreds.
    if (!missing.empty()) why += "missing [" + join_cut(missing) + "]";
    if (!unexpected.empty())
      why += std::string(why.empty() ? "" : "; ") + "unexpected [" + join_cut(unexpected) + "]";
    if (!shapes.empty()) why += std::string(why.empty() ? "" : "; ") + join_cut(shapes, 4, "; ");
    throw Error(source + ": does not match the model: " + why);
  }
  return [copies = std::move(copies), partial_copies = std::move(partial_copies)] {
    torch::NoGradGuard no_grad;
    for (const auto& [destination, from] : copies) destination.copy_(from);
    for (const auto& copy : partial_copies) copy();
  };
}

}  // namespace

std::function<void()> prepare_load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                                              const std::string& source) {
  std::map<std::string, c10::IValue> given;
  for (const auto& [name, t] : tensors) given[name] = t;
  return prepare_load(module, std::move(given), source, {});
}

std::function<void()> prepare_load_state_dict(const torch::nn::Module& module,
                                              const c10::IValue& value, const std::string& source,
                                              const std::map<std::string, PartialTarget>& partial) {
  if (!value.isGenericDict())
    throw Error(source + ": not a state dict (holds a " + value.tagKind() + ", not a dict)");
  std::map<std::string, c10::IValue> given;
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString())
      throw Error(source + ": not a state dict (an entry is not name → tensor)");
    given[entry.key().toStringRef()] = entry.value();
  }
  return prepare_load(module, std::move(given), source, partial);
}

void load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                     const std::string& source) {
  prepare_load_state_dict(module, tensors, source)();
}

}  // namespace fabric
