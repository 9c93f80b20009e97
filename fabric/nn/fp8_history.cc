#include "fabric/nn/fp8_history.h"

#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

namespace {

// Every layer of `modules` with an Fp8History, by its checkpoint name, in named_modules order.
std::vector<std::pair<std::string, Fp8History*>> histories(const NamedModules& modules) {
  std::vector<std::pair<std::string, Fp8History*>> out;
  for (const auto& [entry, module] : modules) {
    auto take = [&](const std::string& name, torch::nn::Module& m) {
      auto* layer = m.as<LinearImpl>();
      if (layer != nullptr && layer->fp8_history()) out.emplace_back(name, &*layer->fp8_history());
    };
    take(entry, *module);
    for (const auto& item : module->named_modules("", /*include_self=*/false))
      take(entry + "/" + item.key(), *item.value());
  }
  return out;
}

}  // namespace

Fp8HistoryPack pack_fp8_histories(const NamedModules& modules) {
  std::vector<torch::Tensor> parts;
  std::ostringstream names;
  for (const auto& [name, h] : histories(modules)) {
    if (!h->amax.defined()) continue;  // not quantized yet: nothing to keep
    parts.push_back(h->amax.detach().to(torch::kCPU, torch::kFloat).flatten());
    parts.push_back(h->seeded.to(torch::kFloat));
    names << name << ' ' << h->length << '\n';
  }
  return {parts.empty() ? torch::empty({0}, torch::kFloat) : torch::cat(parts), names.str()};
}

c10::impl::GenericDict fp8_histories_dict(const torch::Tensor& values, const std::string& names) {
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  const torch::Tensor v = values.to(torch::kCPU, torch::kFloat).contiguous();
  std::istringstream lines(names);
  std::string line;
  int64_t at = 0;
  while (std::getline(lines, line)) {
    const size_t space = line.rfind(' ');
    int64_t length = 0;
    try {
      length = space == std::string::npos ? 0 : std::stoll(line.substr(space + 1));
    } catch (const std::exception&) {
      length = 0;
    }
    const int64_t size = 3 * (length + 1) + 3;
    if (length < 1 || at + size > v.numel())
      throw Error("fp8 amax histories: malformed record '" + line + "'");
    c10::impl::GenericDict layer(c10::StringType::get(), c10::AnyType::get());
    layer.insert("amax", v.slice(0, at, at + 3 * (length + 1)).view({3, length + 1}).clone());
    layer.insert("seeded", v.slice(0, at + 3 * (length + 1), at + size).gt(0.5));
    out.insert(line.substr(0, space), layer);
    at += size;
  }
  if (at != v.numel())
    throw Error("fp8 amax histories: " + std::to_string(v.numel() - at) + " values unnamed");
  return out;
}

std::function<void()> restore_fp8_histories(const c10::IValue& saved, const NamedModules& modules,
                                            std::string* why) {
  auto fail = [&](const std::string& reason) {
    *why = reason;
    return std::function<void()>();
  };
  if (!saved.isGenericDict()) return fail("not a dictionary of layers");
  std::map<std::string, Fp8History*> layers;
  for (const auto& [name, h] : histories(modules)) layers.emplace(name, h);
  std::vector<std::pair<Fp8History*, std::pair<torch::Tensor, torch::Tensor>>> writes;
  for (const auto& item : saved.toGenericDict()) {
    const std::string name = item.key().isString() ? item.key().toStringRef() : "?";
    const auto at = layers.find(name);
    if (at == layers.end()) return fail("saved for a layer this model lacks (" + name + ")");
    const c10::IValue& value = item.value();
    if (!value.isGenericDict()) return fail(name + ": malformed");
    const auto d = value.toGenericDict();
    const auto amax = d.find("amax"), seeded = d.find("seeded");
    if (amax == d.end() || seeded == d.end() || !amax->value().isTensor() ||
        !seeded->value().isTensor())
      return fail(name + ": malformed");
    const torch::Tensor a = amax->value().toTensor(), s = seeded->value().toTensor();
    const int64_t length = at->second->length;
    if (a.dim() != 2 || a.size(0) != 3 || s.numel() != 3) return fail(name + ": malformed");
    if (a.size(1) != length + 1)
      return fail(name + ": " + std::to_string(a.size(1) - 1) +
                  " steps saved, fabric.fp8.amax_history is " + std::to_string(length));
    writes.push_back({at->second, {a.to(torch::kFloat), s.to(torch::kBool).view({3})}});
  }
  return [layers = std::move(layers), writes = std::move(writes)] {
    // In place where a history exists (a CUDA graph may have captured its address); zeros and
    // no flag are a fresh history's state.
    for (const auto& [name, h] : layers) {
      if (h->amax.defined()) h->amax.zero_();
      h->seeded.zero_();
    }
    for (const auto& [h, values] : writes) {
      if (h->amax.defined() && h->amax.sizes() == values.first.sizes())
        h->amax.copy_(values.first);
      else
        h->amax = values.first.clone();  // on the CPU: the first pass moves it to its device
      h->seeded.copy_(values.second);
    }
  };
}

}  // namespace fabric::nn
