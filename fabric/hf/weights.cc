#include "fabric/hf/weights.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/error.h"
#include "fabric/core/json_object.h"

namespace fabric::hf {

namespace fs = std::filesystem;

namespace {

std::string shape(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

void add_file(Weights& w, const fs::path& file, const std::map<std::string, std::string>* wanted) {
  for (auto& [name, tensor] : load_safetensors(file).tensors) {
    if (w.file.count(name))
      throw Error(file.string() + ": tensor " + name + " is also in " + w.file[name].string() +
                  "; a folder holds each tensor once");
    if (wanted && !wanted->count(name)) continue;  // the index does not place it here
    w.file[name] = file;
    w.tensors.emplace_back(name, std::move(tensor));
  }
}

}  // namespace

Weights read_weights(const fs::path& folder) {
  Weights w;
  const fs::path single = folder / "model.safetensors";
  const fs::path index = folder / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const std::string again = "; save the model again with save_pretrained";
    nlohmann::json json = read_json_object(index.string(), again);
    if (!json.contains("weight_map") || !json["weight_map"].is_object())
      throw Error(index.string() + ": weight_map: missing (an object of tensor → shard)" + again);
    // Shard → the tensors the index places in it, shards in the order of their first tensor.
    std::map<std::string, std::map<std::string, std::string>> shards;
    std::vector<std::string> order;
    for (const auto& [name, shard] : json["weight_map"].items()) {
      if (!shard.is_string())
        throw Error(index.string() + ": weight_map." + name + ": not a file name");
      const std::string file = shard.get<std::string>();
      if (!shards.count(file)) order.push_back(file);
      shards[file][name] = file;
    }
    for (const std::string& file : order) {
      const fs::path path = folder / file;
      if (!fs::exists(path))
        throw Error(index.string() + ": shard " + file + " (holding " +
                    shards[file].begin()->first + ", among " + std::to_string(shards[file].size()) +
                    " tensors) is missing from " + folder.string() + "; download or copy it there");
      add_file(w, path, &shards[file]);
      for (const auto& [name, _] : shards[file])
        if (!w.file.count(name))
          throw Error(path.string() + ": tensor " + name +
                      " is not in this shard, where model.safetensors.index.json places it");
    }
    return w;
  }
  if (fs::exists(single)) {
    add_file(w, single, nullptr);
    return w;
  }
  if (!fs::is_directory(folder))
    throw Error(folder.string() + ": no such folder; give a Hugging Face model folder");
  throw Error(folder.string() + ": no model.safetensors or model.safetensors.index.json" +
              (fs::exists(folder / "pytorch_model.bin")
                   ? std::string(" (only pytorch_model.bin, which is not read)")
                   : std::string()) +
              "; save the model with save_pretrained(folder, safe_serialization=True)");
}

StateDict checked_weights(const torch::nn::Module& module, const Weights& weights,
                          const fs::path& folder,
                          const std::function<bool(const std::string&)>& ignore) {
  const auto parameters = module.named_parameters(/*recurse=*/true);
  StateDict kept;
  std::set<std::string> seen;
  for (const auto& [name, tensor] : weights.tensors) {
    if (ignore && ignore(name)) continue;
    const std::string file = weights.file.at(name).string();
    const torch::Tensor* target = parameters.find(name);
    if (target == nullptr)
      throw Error(file + ": unexpected tensor " + name + " " + shape(tensor.sizes()) +
                  ": the model that config.json describes has no such parameter");
    if (target->sizes() != tensor.sizes())
      throw Error(file + ": tensor " + name + " is " + shape(tensor.sizes()) + ", but " +
                  (folder / "config.json").string() + " makes it " + shape(target->sizes()) +
                  "; the config and the weights disagree");
    if (!tensor.is_floating_point())
      throw Error(file + ": tensor " + name + " is " +
                  std::string(c10::toString(tensor.scalar_type())) +
                  ", not a floating-point tensor (quantized weights are not read)");
    seen.insert(name);
    kept.emplace_back(name, tensor);
  }
  for (const auto& item : parameters)
    if (!seen.count(item.key()))
      throw Error(folder.string() + ": tensor " + item.key() + " " + shape(item.value().sizes()) +
                  " is missing from the weights, but " + (folder / "config.json").string() +
                  " asks for it (check tie_word_embeddings, num_hidden_layers and the biases)");
  return kept;
}

void load_weights(torch::nn::Module& module, const Weights& weights, const fs::path& folder,
                  const std::function<bool(const std::string&)>& ignore) {
  load_state_dict(module, checked_weights(module, weights, folder, ignore), folder.string());
}

void check_config_sizes(const Weights& weights, const ConfigSizes& s) {
  const std::string fix =
      "; config.json and the weights must describe the same model (as save_pretrained writes "
      "them): use the folder's own config.json";
  int64_t held = 0;
  std::string layer_file;
  for (const auto& [name, tensor] : weights.tensors) {
    for (const std::string& prefix : s.layer_prefixes) {
      if (name.rfind(prefix, 0) != 0) continue;
      const std::string rest = name.substr(prefix.size());
      const size_t dot = rest.find('.');
      if (dot == 0 || dot == std::string::npos || dot > 9 ||
          rest.find_first_not_of("0123456789") != dot)
        continue;
      const int64_t index = std::stoll(rest.substr(0, dot));
      if (index + 1 > held) {  // the file of the highest layer, for the message
        held = index + 1;
        layer_file = weights.file.at(name).filename().string();
      }
    }
  }
  if (held == 0 && !weights.tensors.empty()) {
    // Not a count to compare: the tensors are named otherwise (a model saved without its head,
    // an unmerged adapter's base_model.model. prefix).
    const auto& [first, tensor] = weights.tensors.front();
    throw Error(weights.file.at(first).string() + ": no tensor is named " +
                s.layer_prefixes.front() + "N.* (the first is " + first +
                "): not the weights of the causal language model config.json describes; give "
                "the folder save_pretrained writes for it (a merged model, with its head)");
  }
  if (held != s.layers)
    throw Error(s.config.string() + ": " + s.layers_key + " " + std::to_string(s.layers) +
                ", but the weights hold " + std::to_string(held) + " layers" +
                (layer_file.empty() ? "" : " (" + layer_file + ")") + fix);
  for (const auto& [name, tensor] : weights.tensors) {
    if (std::find(s.embedding_names.begin(), s.embedding_names.end(), name) ==
        s.embedding_names.end())
      continue;
    if (tensor.dim() == 2 && tensor.size(0) == s.vocab && tensor.size(1) == s.width) continue;
    throw Error(s.config.string() + ": " + s.vocab_key + " " + std::to_string(s.vocab) + " and " +
                s.width_key + " " + std::to_string(s.width) + " make the token embedding [" +
                std::to_string(s.vocab) + ", " + std::to_string(s.width) + "], but " + name +
                " is " + shape(tensor.sizes()) + " in " +
                weights.file.at(name).filename().string() + fix);
  }
}

}  // namespace fabric::hf
