#include "fabric/nn/lora.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/checkpoint/output_check.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/json_object.h"
#include "fabric/core/suggest.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/frozen_weight.h"
#include "fabric/nn/tensor_parallel.h"

namespace fabric::nn {

namespace {

const std::string kPrefix = "base_model.model.";

std::vector<std::string> components(const std::string& name) {
  std::vector<std::string> out;
  std::string part;
  std::istringstream in(name);
  while (std::getline(in, part, '.')) out.push_back(part);
  return out;
}

// The pattern's components equal the name's last ones ('*' any one component).
bool target_matches(const std::string& pattern, const std::string& name) {
  const std::vector<std::string> p = components(pattern), n = components(name);
  if (p.empty() || p.size() > n.size()) return false;
  const size_t offset = n.size() - p.size();
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i] != "*" && p[i] != n[offset + i]) return false;
  return true;
}

// The model's fabric::nn::Linear layers (not the adapters' own torch::nn::Linear ones).
std::vector<std::pair<std::string, LinearImpl*>> linear_layers(torch::nn::Module& model) {
  std::vector<std::pair<std::string, LinearImpl*>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false))
    if (auto* linear = item.value()->as<LinearImpl>()) out.emplace_back(item.key(), linear);
  return out;
}

// "'q_proj', 'k_proj', ...": the layers' last components, closest to `pattern` first.
std::string closest_names(const std::vector<std::pair<std::string, LinearImpl*>>& layers,
                          const std::string& pattern) {
  std::vector<std::string> names;
  for (const auto& [name, layer] : layers) {
    const std::string last = components(name).back();
    if (std::find(names.begin(), names.end(), last) == names.end()) names.push_back(last);
  }
  std::stable_sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
    return edit_distance(a, pattern) < edit_distance(b, pattern);
  });
  for (std::string& n : names) n = "'" + n + "'";
  return join_cut(names, 6);
}

std::string sizes_of(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

std::string format_double(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

std::vector<std::string> apply_lora(torch::nn::Module& model, const LoraOptions& options) {
  const std::string head = "LoRA: ";
  if (options.target_modules.empty())
    throw Error(head +
                "target_modules is empty; name the Linear layers to adapt, e.g. "
                "{\"q_proj\", \"v_proj\"}");
  if (options.rank < 1)
    throw Error(head + "rank must be at least 1 (got " + std::to_string(options.rank) + ")");
  if (!(options.alpha > 0))
    throw Error(head + "alpha must be positive (got " + format_double(options.alpha) + ")");
  if (!(options.dropout >= 0 && options.dropout < 1))
    throw Error(head + "dropout must be in [0, 1) (got " + format_double(options.dropout) + ")");
  const auto layers = linear_layers(model);
  std::vector<char> chosen(layers.size(), 0);
  for (const std::string& pattern : options.target_modules) {
    bool any = false;
    for (size_t i = 0; i < layers.size(); ++i)
      if (target_matches(pattern, layers[i].first)) chosen[i] = any = true;
    if (!any)
      throw Error(head + "target module '" + pattern + "' matches no fabric::nn::Linear layer" +
                  (layers.empty()
                       ? std::string(" (the model has none)")
                       : "; its Linear layers, closest first: " + closest_names(layers, pattern)) +
                  " (a pattern matches a name's last components, '*' any one component)");
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!chosen[i]) continue;
    const LinearImpl& l = *layers[i].second;
    const int64_t in = l.options.in_features(), out = l.options.out_features();
    if (options.rank > std::min(in, out))
      throw Error(head + "rank " + std::to_string(options.rank) + " is larger than layer '" +
                  layers[i].first + "' [out " + std::to_string(out) + ", in " + std::to_string(in) +
                  "] allows (min(in, out) = " + std::to_string(std::min(in, out)) + ")");
    if (l.lora_rank() > 0)
      throw Error(head + "layer '" + layers[i].first + "' has an adapter already");
    // A meta base outside an empty init's recording: the adapters would get no values at setup.
    if (l.weight.is_meta() && !recording_empty_init())
      throw Error(head + "layer '" + layers[i].first +
                  "' is on the meta device (an empty init); call apply_lora inside "
                  "Fabric::init_module's function, so that setup gives the adapters their values");
  }
  // Everything but the adapters (those of an earlier apply_lora keep training).
  for (auto& item : model.named_parameters())
    if (item.key().find("lora_A.") == std::string::npos &&
        item.key().find("lora_B.") == std::string::npos)
      item.value().set_requires_grad(false);
  std::vector<std::string> names;
  const double scaling = options.alpha / static_cast<double>(options.rank);
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!chosen[i]) continue;
    layers[i].second->set_lora(options.rank, scaling, options.dropout);
    names.push_back(layers[i].first);
  }
  return names;
}

std::string to_string(LoraBaseDtype dtype) {
  switch (dtype) {
    case LoraBaseDtype::kBf16:
      return "bf16";
    case LoraBaseDtype::kFp8:
      return "fp8";
    default:
      return "auto";
  }
}

LoraBaseDtype parse_lora_base_dtype(const std::string& text) {
  for (LoraBaseDtype d : {LoraBaseDtype::kAuto, LoraBaseDtype::kBf16, LoraBaseDtype::kFp8})
    if (to_string(d) == text) return d;
  throw Error("LoRA: base dtype '" + text + "' is not one of auto, bf16, fp8");
}

namespace {

// Whether the layer's weight is stored apart from the adapters' dtype (store_lora_base's).
bool stored_base(LinearImpl& layer) {
  return layer.weight_scale().defined() ||
         (layer.lora_rank() > 0 &&
          layer.weight.scalar_type() != layer.lora_A->weight.scalar_type());
}

}  // namespace

std::vector<std::string> store_lora_base(torch::nn::Module& model, LoraBaseDtype dtype) {
  std::vector<std::string> names;
  if (dtype == LoraBaseDtype::kAuto) return names;
  const std::string head = "LoRA: base dtype " + to_string(dtype) + ": layer '";
  const torch::ScalarType want =
      dtype == LoraBaseDtype::kBf16 ? torch::kBFloat16 : torch::kFloat8_e4m3fn;
  torch::NoGradGuard no_grad;
  for (auto& [name, layer] : linear_layers(model)) {
    if (layer->lora_rank() == 0) continue;
    const torch::Tensor w = layer->weight.detach();
    if (layer->weight.requires_grad())
      throw Error(head + name + "' has a weight that trains; a frozen base only (apply_lora " +
                  "freezes it; a full fine-tune trains the base)");
    if (w.is_meta())
      throw Error(head + name + "' is on the meta device; load the base weights first");
    if (w.scalar_type() == want) continue;
    if (stored_base(*layer))
      throw Error(head + name + "' is stored already as " + c10::toString(w.scalar_type()));
    if (dtype == LoraBaseDtype::kBf16) {
      replace_data(layer->weight, w.to(torch::kBFloat16));
    } else {
      torch::Tensor amax = w.abs().amax({1}).to(torch::kFloat);
      // A row-split layer holds part of each row: the row's largest magnitude over the ranks,
      // so that each rank's scale is the whole layer's (one process's numbers).
      const auto& p = layer->parallel();
      if (p && p->style.kind == TensorParallelStyle::Kind::kRow && p->size > 1) {
        std::vector<torch::Tensor> t = {amax.contiguous()};
        c10d::AllreduceOptions o;
        o.reduceOp = c10d::ReduceOp::MAX;
        distributed::wait(p->group->allreduce(t, o), "LoRA base scale all_reduce (max)");
        amax = t[0];
      }
      auto [q, scale] = quantize_rows_fp8(w, amax);
      replace_data(layer->weight, q);
      layer->register_buffer(kWeightScale, scale);
    }
    names.push_back(name);
  }
  return names;
}

bool is_lora_tensor(const std::string& name) {
  for (const std::string& part : components(name))
    if (part == "lora_A" || part == "lora_B") return true;
  return false;
}

std::vector<std::string> merge_lora(torch::nn::Module& model) {
  std::vector<std::string> names;
  torch::NoGradGuard no_grad;
  for (auto& [name, layer] : linear_layers(model)) {
    if (layer->lora_rank() == 0) continue;
    const torch::Tensor delta =
        torch::matmul(layer->lora_B->weight, layer->lora_A->weight) * layer->lora_scaling();
    if (stored_base(*layer)) {  // dequantized, the sum in the adapters' dtype
      const torch::Tensor base =
          dequantize_weight(layer->weight.detach(), layer->weight_scale(), torch::kFloat);
      replace_data(layer->weight,
                   (base + delta.to(torch::kFloat)).to(layer->lora_A->weight.scalar_type()));
    } else {
      layer->weight.add_(delta.to(layer->weight.scalar_type()));
    }
    // LibTorch cannot unregister a buffer: a float8 base's scale stays, as ones (the weight is
    // no longer float8, so forward ignores it; merge_lora_state drops it from a state).
    if (const torch::Tensor scale = layer->weight_scale(); scale.defined()) scale.fill_(1);
    layer->clear_lora();
    names.push_back(name);
  }
  return names;
}

namespace {

// An adapter tensor of the model: the parameter, its whole sizes, and the layer when tensor
// parallelism cut it (its LoraCut names it).
struct AdapterTensor {
  torch::Tensor param;
  std::vector<int64_t> whole_sizes;
  const LinearImpl* cut_by = nullptr;
  int64_t along = 0;
};

std::vector<std::pair<std::string, AdapterTensor>> adapter_tensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, AdapterTensor>> out;
  for (auto& [name, layer] : linear_layers(model)) {
    if (layer->lora_rank() == 0) continue;
    const auto cut = layer->lora_cut();
    for (const char* part : {"lora_A.weight", "lora_B.weight"}) {
      const torch::Tensor& w = part[5] == 'A' ? layer->lora_A->weight : layer->lora_B->weight;
      AdapterTensor t{w, w.sizes().vec()};
      if (cut && cut->name == part) {
        t.whole_sizes = cut->whole_sizes;
        t.cut_by = layer;
        t.along = cut->along;
      }
      out.emplace_back(kPrefix + name + "." + part, t);
    }
  }
  return out;
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> lora_state(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, t] : adapter_tensors(model))
    out.emplace_back(name, t.cut_by ? t.cut_by->parallel()->gather(t.param.detach(), t.along)
                                    : t.param.detach());
  return out;
}

void load_lora_state(torch::nn::Module& model,
                     const std::vector<std::pair<std::string, torch::Tensor>>& state) {
  std::map<std::string, AdapterTensor> ours;
  for (auto& [name, tensor] : adapter_tensors(model)) ours.emplace(name, tensor);
  if (ours.empty())
    throw Error("load_lora_state: the model has no LoRA adapter (apply_lora first)");
  std::set<std::string> loaded;
  torch::NoGradGuard no_grad;
  for (const auto& [given, tensor] : state) {
    std::string name = given.rfind(kPrefix, 0) == 0 ? given : kPrefix + given;
    for (const char* adapter : {".lora_A.default.weight", ".lora_B.default.weight"}) {
      const size_t at = name.rfind(adapter);
      if (at != std::string::npos && at + std::string(adapter).size() == name.size())
        name = name.substr(0, at) + std::string(adapter).substr(0, 7) + ".weight";
    }
    auto it = ours.find(name);
    if (it == ours.end()) {
      std::vector<std::string> keys;
      for (const auto& kv : ours) keys.push_back(kv.first);
      throw Error("load_lora_state: '" + given + "' is no adapter of the model" +
                  did_you_mean(name, keys));
    }
    const AdapterTensor& t = it->second;
    if (!tensor.sizes().equals(t.whole_sizes))
      throw Error("load_lora_state: '" + given + "' is " + sizes_of(tensor.sizes()) +
                  ", the model's adapter " + sizes_of(t.whole_sizes) +
                  " (another rank's slice, or another base model?)");
    // A tensor tensor parallelism cut: this rank's slice of the whole one.
    t.param.detach().copy_(t.cut_by ? t.cut_by->parallel()->slice(tensor, t.along) : tensor);
    loaded.insert(name);
  }
  for (const auto& kv : ours)
    if (!loaded.count(kv.first))
      throw Error("load_lora_state: the state has no '" + kv.first + "' (" +
                  std::to_string(ours.size() - loaded.size()) + " of the model's " +
                  std::to_string(ours.size()) + " adapter tensors missing)");
}

void save_lora_adapter(torch::nn::Module& model, const std::filesystem::path& folder,
                       const LoraOptions& options, const std::string& base_model_name_or_path) {
  const auto state = lora_state(model);
  if (state.empty())
    throw Error("save_lora_adapter: the model has no LoRA adapter (apply_lora first)");
  // The file says what the model holds: one rank and one scaling for every adapter (peft's
  // adapter_config.json has no other), and target_modules naming exactly the adapted layers: the
  // last components when they select no other layer, else the layers' whole names.
  LoraOptions written = options;
  const auto layers = linear_layers(model);
  std::set<std::string> adapted, lasts;
  for (const auto& [name, layer] : layers) {
    if (layer->lora_rank() == 0) continue;
    const double scaling = options.alpha / static_cast<double>(options.rank);
    if (layer->lora_rank() != options.rank ||
        std::abs(layer->lora_scaling() - scaling) > 1e-12 * std::abs(scaling))
      throw Error("save_lora_adapter: layer '" + name + "' has an adapter of rank " +
                  std::to_string(layer->lora_rank()) + " and scaling " +
                  format_double(layer->lora_scaling()) + ", the options rank " +
                  std::to_string(options.rank) + " and alpha " + format_double(options.alpha) +
                  " (scaling " + format_double(scaling) +
                  "); save with the options apply_lora was given (an adapter file holds one "
                  "rank and alpha)");
    adapted.insert(name);
    lasts.insert(components(name).back());
  }
  bool exact = true;
  for (const auto& [name, layer] : layers)
    if (lasts.count(components(name).back()) && !adapted.count(name)) exact = false;
  const std::set<std::string> given(options.target_modules.begin(), options.target_modules.end());
  if (!exact || given != lasts)  // the options' own list when it is exactly that (its order kept)
    written.target_modules.assign(exact ? lasts.begin() : adapted.begin(),
                                  exact ? lasts.end() : adapted.end());
  save_lora_adapter(state, folder, written, base_model_name_or_path);
}

std::vector<std::pair<std::string, torch::Tensor>> lora_state_of(
    const std::vector<std::pair<std::string, torch::Tensor>>& whole) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& [name, tensor] : whole)
    if (name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos)
      out.emplace_back(kPrefix + name, tensor);
  return out;
}

void merge_lora_state(std::vector<std::pair<std::string, torch::Tensor>>& whole,
                      const LoraOptions& options) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < whole.size(); ++i) index.emplace(whole[i].first, i);
  const std::string suffix = ".lora_A.weight";
  std::set<std::string> scales;  // the merged layers' float8 scales, dropped with the adapters
  torch::NoGradGuard no_grad;
  for (const auto& [name, a] : whole) {
    if (name.size() <= suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
      continue;
    const std::string layer = name.substr(0, name.size() - suffix.size());
    const auto b = index.find(layer + ".lora_B.weight");
    const auto w = index.find(layer + ".weight");
    if (b == index.end() || w == index.end())
      throw Error("merge_lora_state: " + layer + ": the state has its lora_A but not " +
                  (b == index.end() ? "its lora_B" : "its base weight"));
    torch::Tensor& base = whole[w->second].second;
    const torch::Tensor delta =
        torch::matmul(whole[b->second].second.to(torch::kFloat), a.to(torch::kFloat)) *
        (options.alpha / static_cast<double>(options.rank));
    // A stored base (store_lora_base): dequantized, the merged weight in the adapters' dtype.
    const auto s = index.find(layer + "." + kWeightScale);
    const torch::Tensor scale = s == index.end() ? torch::Tensor() : whole[s->second].second;
    const torch::ScalarType out = scale.defined() || base.scalar_type() != a.scalar_type()
                                      ? a.scalar_type()
                                      : base.scalar_type();
    if (scale.defined()) scales.insert(layer + "." + kWeightScale);
    base = (dequantize_weight(base, scale, torch::kFloat) + delta.to(base.device())).to(out);
  }
  whole.erase(std::remove_if(whole.begin(), whole.end(),
                             [&](const auto& e) {
                               return e.first.find(".lora_A.") != std::string::npos ||
                                      e.first.find(".lora_B.") != std::string::npos ||
                                      scales.count(e.first) > 0;
                             }),
              whole.end());
}

void save_lora_adapter(const std::vector<std::pair<std::string, torch::Tensor>>& state,
                       const std::filesystem::path& folder, const LoraOptions& options,
                       const std::string& base_model_name_or_path) {
  if (state.empty()) throw Error("save_lora_adapter: no adapter tensors to save");
  // The adapted layers (from the tensors' names): their rank must be the options', and
  // target_modules must select them in peft, which knows no '*': else their whole names.
  const std::string a_suffix = ".lora_A.weight";
  std::vector<std::string> adapted;
  bool covered = true;
  for (const auto& [name, tensor] : state) {
    if (name.size() <= kPrefix.size() + a_suffix.size() ||
        name.compare(name.size() - a_suffix.size(), a_suffix.size(), a_suffix) != 0)
      continue;
    const std::string layer =
        name.substr(kPrefix.size(), name.size() - kPrefix.size() - a_suffix.size());
    if (tensor.dim() != 2 || tensor.size(0) != options.rank)
      throw Error("save_lora_adapter: " + name + " is " + sizes_of(tensor.sizes()) +
                  ", not of the options' rank " + std::to_string(options.rank) +
                  "; save with the options apply_lora was given");
    adapted.push_back(layer);
    bool matched = false;
    for (const std::string& t : options.target_modules)
      matched = matched || (t.find('*') == std::string::npos && target_matches(t, layer));
    covered = covered && matched;
  }
  LoraOptions written = options;
  if (!covered) written.target_modules = adapted;
  check_export_folder(folder, "the adapter's folder");
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw Error("cannot write " + folder.string() + ": " + ec.message());
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [name, tensor] : state) tensors.emplace_back(name, tensor.cpu().contiguous());
  save_safetensors(folder / "adapter_model.safetensors", tensors, export_metadata());
  nlohmann::ordered_json config = {
      {"base_model_name_or_path", base_model_name_or_path.empty()
                                      ? nlohmann::ordered_json(nullptr)
                                      : nlohmann::ordered_json(base_model_name_or_path)},
      {"bias", "none"},
      {"fan_in_fan_out", written.fan_in_fan_out},
      {"inference_mode", true},
      {"init_lora_weights", true},
      {"lora_alpha", written.alpha},
      {"lora_dropout", written.dropout},
      {"modules_to_save", nullptr},
      {"peft_type", "LORA"},
      {"r", written.rank},
      {"target_modules", written.target_modules},
      {"task_type", "CAUSAL_LM"},
      {"use_dora", false},
      {"use_rslora", false},
  };
  write_file_atomically(folder / "adapter_config.json", config.dump(2) + "\n");
  // Into an earlier merged export (check_export_folder allowed no other non-empty folder): its
  // model files go, so the folder is an adapter alone.
  std::vector<std::filesystem::path> stale;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec))
    if (is_model_export_file(entry.path().filename().string())) stale.push_back(entry.path());
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}

LoraOptions read_lora_options(const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / "adapter_config.json";
  if (!std::filesystem::exists(path))
    throw Error(path.string() + ": cannot read (not a peft adapter folder?)");
  const nlohmann::json j = read_json_object(path.string());
  auto fail = [&](const std::string& what) { throw Error(path.string() + ": " + what); };
  const nlohmann::json type = j.contains("peft_type") ? j["peft_type"] : nlohmann::json();
  if (type != "LORA")
    fail("peft_type must be LORA (got " + (type.is_null() ? "none" : type.dump()) + ")");
  // What peft can vary per module or restrict, which these options cannot express: ignored, it
  // would change the adapter silently (alpha_pattern: another scaling for the modules it names).
  for (const char* key :
       {"alpha_pattern", "rank_pattern", "layers_to_transform", "layers_pattern", "exclude_modules",
        "modules_to_save", "lora_bias", "target_parameters", "trainable_token_indices"}) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null() || (it->is_boolean() && !it->get<bool>()) ||
        ((it->is_object() || it->is_array()) && it->empty()) ||
        (it->is_string() && it->get<std::string>().empty()))
      continue;
    fail(std::string(key) + ": " + it->dump().substr(0, 80) +
         " is not supported (an adapter with one rank and alpha for every module it lists)");
  }
  for (const char* flag : {"use_dora", "use_rslora"})
    if (j.contains(flag) && j[flag].is_boolean() && j[flag].get<bool>())
      fail(std::string(flag) + ": true is not supported");
  if (j.contains("bias") && j["bias"] != "none") fail("bias: only \"none\" is supported");
  LoraOptions o;
  try {
    o.rank = j.at("r").get<int64_t>();
    o.alpha = j.at("lora_alpha").get<double>();
    o.dropout = j.value("lora_dropout", 0.0);
    o.fan_in_fan_out = j.value("fan_in_fan_out", false);
    if (!j.at("target_modules").is_array())
      fail("target_modules: a regular expression is not supported; list the module names");
    o.target_modules = j.at("target_modules").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("missing or mistyped key: ") + e.what());
  }
  // The file's own values, named by its keys (apply_lora would name its options instead).
  if (o.rank < 1) fail("r is " + std::to_string(o.rank) + "; a LoRA rank is at least 1");
  if (!(o.alpha > 0)) fail("lora_alpha is " + format_double(o.alpha) + "; it must be positive");
  if (!(o.dropout >= 0 && o.dropout < 1))
    fail("lora_dropout is " + format_double(o.dropout) + "; it must be in [0, 1)");
  return o;
}

std::vector<std::pair<std::string, torch::Tensor>> read_lora_state(
    const std::filesystem::path& folder) {
  const std::filesystem::path path = folder / "adapter_model.safetensors";
  SafetensorsFile file = load_safetensors(path);
  // The two files of one folder agree on the rank (lora_A [r, in], lora_B [out, r]); one edited or
  // copied from another adapter would otherwise look like an adapter for another base model.
  int64_t r = 0;
  try {
    r = read_lora_options(folder).rank;
  } catch (const Error&) {
    // No readable config: the tensors alone (read_lora_options says what is wrong when called).
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& [name, tensor] : file.tensors) {
    const bool a = name.find("lora_A.") != std::string::npos;
    const bool b = name.find("lora_B.") != std::string::npos;
    if (r > 0 && tensor.dim() == 2 && (a || b) && tensor.size(a ? 0 : 1) != r)
      throw Error(path.string() + ": " + name + " has rank " +
                  std::to_string(tensor.size(a ? 0 : 1)) + " but adapter_config.json's r is " +
                  std::to_string(r) + "; the folder's two files come from different adapters");
    out.emplace_back(name, tensor);
  }
  return out;
}

}  // namespace fabric::nn
