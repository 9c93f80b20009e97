#include "fabric/checkpoint/state_dict.h"

#include <torch/torch.h>

#include <map>
#include <sstream>

#include "fabric/checkpoint/archive.h"
#include "fabric/core/error.h"
#include "fabric/core/suggest.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
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

StateDict load_state_dict_file(const fs::path& path) {
  return state_dict_from(load_archive(path), path.string());
}

std::function<void()> prepare_load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                                              const std::string& source) {
  std::map<std::string, torch::Tensor> given;
  for (const auto& [name, t] : tensors) given[name] = t;
  std::vector<std::string> missing, shapes;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // (destination, source)
  for (const auto& [name, target] : state_dict(module)) {
    auto it = given.find(name);
    if (it == given.end()) {
      missing.push_back(name);
      continue;
    }
    if (!it->second.sizes().equals(target.sizes())) {
      shapes.push_back("shape of " + name + " is " + shape_of(it->second) + " in the file, " +
                       shape_of(target) + " in the model");
    } else {
      copies.emplace_back(target, it->second);
    }
    given.erase(it);
  }
  std::vector<std::string> unexpected;
  for (const auto& [name, t] : given) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !shapes.empty()) {
    std::string why;
    if (!missing.empty()) why += "missing [" + join(missing) + "]";
    if (!unexpected.empty())
      why += std::string(why.empty() ? "" : "; ") + "unexpected [" + join(unexpected) + "]";
    for (const auto& s : shapes) why += (why.empty() ? "" : "; ") + s;
    throw Error(source + ": does not match the model: " + why);
  }
  return [copies = std::move(copies)] {
    torch::NoGradGuard no_grad;
    for (const auto& [destination, from] : copies) destination.copy_(from);
  };
}

void load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                     const std::string& source) {
  prepare_load_state_dict(module, tensors, source)();
}

}  // namespace fabric
