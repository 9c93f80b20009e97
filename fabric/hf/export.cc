#include "fabric/hf/export.h"

#include <unistd.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "fabric/checkpoint/output_check.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace fabric::hf {

namespace fs = std::filesystem;
using fabric::models::GPTConfig;
using fabric::models::LlamaConfig;

namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

std::string shape(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The floating dtype every tensor of `state` has, as config.json's torch_dtype names it.
std::string dtype_of(const StateDict& state, const std::string& what) {
  if (state.empty()) throw Error(what + ": the state is empty; give the model's whole state");
  const auto type = state.front().second.scalar_type();
  for (const auto& [name, t] : state) {
    if (t.scalar_type() != type)
      throw Error(what + ": tensor " + name + " is " + std::string(c10::toString(t.scalar_type())) +
                  " but " + state.front().first + " is " + std::string(c10::toString(type)) +
                  "; convert the state to one dtype first");
  }
  switch (type) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      throw Error(what + ": tensor " + state.front().first + " is " +
                  std::string(c10::toString(type)) + ", not float32, bfloat16, float16 or float64");
  }
}

// `state` against the names and shapes the config implies: every one present, nothing else
// (names in `skip` are allowed and dropped). Returns the tensors in `expected`'s order.
StateDict checked(const StateDict& state, const Shapes& expected, const std::string& what,
                  const std::set<std::string>& skip = {}) {
  std::map<std::string, torch::Tensor> given;
  for (const auto& [name, t] : state) {
    if (skip.count(name)) continue;
    if (!given.emplace(name, t).second)
      throw Error(what + ": tensor " + name + " is in the state twice");
  }
  StateDict out;
  for (const auto& [name, sizes] : expected) {
    const auto it = given.find(name);
    if (it == given.end())
      throw Error(what + ": tensor " + name + " " + shape(sizes) +
                  " is missing from the state, but the config asks for it; give the whole "
                  "unsharded state");
    if (it->second.sizes() != at::IntArrayRef(sizes))
      throw Error(what + ": tensor " + name + " is " + shape(it->second.sizes()) +
                  ", but the config makes it " + shape(sizes) + "; the config and state disagree");
    out.emplace_back(name, it->second);
    given.erase(it);
  }
  if (!given.empty())
    throw Error(what + ": unexpected tensor " + given.begin()->first + " " +
                shape(given.begin()->second.sizes()) +
                ": the model the config describes has no such parameter");
  return out;
}

fs::path without_trailing_slash(const fs::path& p) {
  return p.has_filename() || !p.has_parent_path() ? p : p.parent_path();
}

void write_folder(const nlohmann::json& config, const StateDict& tensors, const fs::path& tmp,
                  int64_t max_shard_bytes, const std::vector<fs::path>& copy_files);

void remove_or_throw(const fs::path& p) {
  std::error_code ec;
  remove_tree(p, ec);
  if (ec) throw Error("cannot remove " + p.string() + ": " + ec.message());
}

}  // namespace

nlohmann::json llama_config_json(const LlamaConfig& c, const std::string& torch_dtype) {
  nlohmann::json j;
  const std::string what = "save_llama: LlamaConfig.model_type " + c.model_type;
  if (c.model_type == "llama") {
    j["architectures"] = {"LlamaForCausalLM"};
  } else if (c.model_type == "qwen2") {
    j["architectures"] = {"Qwen2ForCausalLM"};
  } else if (c.model_type == "mistral") {
    j["architectures"] = {"MistralForCausalLM"};
  } else {
    throw Error("save_llama: LlamaConfig.model_type: '" + c.model_type +
                "' is not llama, qwen2 or mistral");
  }
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.resolved_head_dim();
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["attention_dropout"] = 0.0;
  j["initializer_range"] = 0.02;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["use_cache"] = true;
  // Rotary settings both ways: transformers 5 reads rope_parameters, transformers 4 rope_theta and
  // rope_scaling.
  nlohmann::json rope = {{"rope_type", c.rope_type}, {"rope_theta", c.rope_theta}};
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  if (c.rope_type == "llama3") {
    nlohmann::json scaling = {
        {"rope_type", "llama3"},
        {"factor", c.rope_factor},
        {"low_freq_factor", c.rope_low_freq_factor},
        {"high_freq_factor", c.rope_high_freq_factor},
        {"original_max_position_embeddings", c.rope_original_max_position_embeddings}};
    j["rope_scaling"] = scaling;
    rope.update(scaling);
  } else if (c.rope_type != "default") {
    throw Error("save_llama: LlamaConfig.rope_type: '" + c.rope_type +
                "' is not supported (default, llama3)");
  }
  j["rope_parameters"] = rope;
  if (c.model_type == "qwen2") {
    if (c.attention_bias)
      throw Error(what + " has no o_proj bias; attention_bias must be false for qwen2");
    if (!c.qkv_bias) throw Error(what + " always has q/k/v biases; qkv_bias must be true");
    j["use_sliding_window"] = c.sliding_window > 0;
    j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
    j["max_window_layers"] = c.sliding_window > 0 ? 0 : c.num_hidden_layers;
  } else {
    if (c.qkv_bias && !c.attention_bias)
      throw Error(what + " cannot have q/k/v biases without o_proj's; use model_type qwen2");
    j["attention_bias"] = c.attention_bias;
    j["mlp_bias"] = false;
    if (c.model_type == "mistral")
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nullptr;
  }
  j["torch_dtype"] = torch_dtype;
  j["dtype"] = torch_dtype;
  return j;
}

nlohmann::json gpt2_config_json(const GPTConfig& c, const std::string& torch_dtype) {
  std::string act;
  if (c.gelu == "tanh") {
    act = "gelu_new";
  } else if (c.gelu == "none") {
    act = "gelu";
  } else {
    throw Error("save_gpt2: GPTConfig.gelu: '" + c.gelu + "' is not tanh or none");
  }
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.block_size},
          {"n_ctx", c.block_size},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"activation_function", act},
          {"layer_norm_epsilon", c.layer_norm_epsilon},
          {"resid_pdrop", c.dropout},
          {"embd_pdrop", c.dropout},
          {"attn_pdrop", c.dropout},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"add_cross_attention", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"torch_dtype", torch_dtype},
          {"dtype", torch_dtype}};
}

void save_llama(const LlamaConfig& c, const StateDict& state, const fs::path& folder,
                int64_t max_shard_bytes, const ExportExtras& extras) {
  const std::string what = "save_llama " + folder.string();
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(what + ": " + e.what());
  }
  const int64_t H = c.hidden_size, I = c.intermediate_size, hd = c.resolved_head_dim();
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  Shapes expected = {{"model.embed_tokens.weight", {c.vocab_size, H}}};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const bool qkv_bias = c.qkv_bias || c.attention_bias;
    expected.push_back({p + "input_layernorm.weight", {H}});
    expected.push_back({p + "self_attn.q_proj.weight", {q, H}});
    if (qkv_bias) expected.push_back({p + "self_attn.q_proj.bias", {q}});
    expected.push_back({p + "self_attn.k_proj.weight", {kv, H}});
    if (qkv_bias) expected.push_back({p + "self_attn.k_proj.bias", {kv}});
    expected.push_back({p + "self_attn.v_proj.weight", {kv, H}});
    if (qkv_bias) expected.push_back({p + "self_attn.v_proj.bias", {kv}});
    expected.push_back({p + "self_attn.o_proj.weight", {H, q}});
    if (c.attention_bias) expected.push_back({p + "self_attn.o_proj.bias", {H}});
    expected.push_back({p + "post_attention_layernorm.weight", {H}});
    expected.push_back({p + "mlp.gate_proj.weight", {I, H}});
    expected.push_back({p + "mlp.up_proj.weight", {I, H}});
    expected.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  expected.push_back({"model.norm.weight", {H}});
  if (!c.tie_word_embeddings) expected.push_back({"lm_head.weight", {c.vocab_size, H}});
  std::set<std::string> skip;
  if (c.tie_word_embeddings) skip.insert("lm_head.weight");
  const StateDict tensors = checked(state, expected, what, skip);
  nlohmann::json config = llama_config_json(c, dtype_of(tensors, what));
  config.merge_patch(extras.config);
  save_hf_folder(config, tensors, folder, max_shard_bytes, extras.copy_files);
}

void save_gpt2(const GPTConfig& c, const StateDict& state, const fs::path& folder,
               int64_t max_shard_bytes, const ExportExtras& extras) {
  const std::string what = "save_gpt2 " + folder.string();
  if (c.n_head < 1 || c.n_embd % c.n_head != 0)
    throw Error(what + ": GPTConfig.n_embd " + std::to_string(c.n_embd) +
                " is not a multiple of n_head " + std::to_string(c.n_head));
  const int64_t C = c.n_embd;
  Shapes expected = {{"transformer.wte.weight", {c.vocab_size, C}},
                     {"transformer.wpe.weight", {c.block_size, C}}};
  // Linear layers: name, [out, in] as the GPT holds them.
  std::vector<std::pair<std::string, std::vector<int64_t>>> linears;
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    expected.push_back({p + "ln_1.weight", {C}});
    expected.push_back({p + "ln_1.bias", {C}});
    linears.push_back({p + "attn.c_attn", {3 * C, C}});
    linears.push_back({p + "attn.c_proj", {C, C}});
    expected.push_back({p + "ln_2.weight", {C}});
    expected.push_back({p + "ln_2.bias", {C}});
    linears.push_back({p + "mlp.c_fc", {4 * C, C}});
    linears.push_back({p + "mlp.c_proj", {C, 4 * C}});
  }
  for (const auto& [name, sizes] : linears) {
    expected.push_back({name + ".weight", sizes});
    if (c.bias) expected.push_back({name + ".bias", {sizes[0]}});
  }
  expected.push_back({"transformer.ln_f.weight", {C}});
  expected.push_back({"transformer.ln_f.bias", {C}});
  const StateDict ours = checked(state, expected, what);
  const std::string dtype = dtype_of(ours, what);
  std::map<std::string, torch::Tensor> by_name(ours.begin(), ours.end());
  StateDict tensors;
  for (const auto& [name, t] : ours) {
    const bool linear_weight =
        name.rfind("transformer.h.", 0) == 0 && ends_with(name, ".weight") &&
        (ends_with(name, ".c_attn.weight") || ends_with(name, ".c_proj.weight") ||
         ends_with(name, ".c_fc.weight"));
    tensors.emplace_back(name, linear_weight ? t.t().contiguous() : t);
    if (linear_weight && !c.bias) {
      const std::string bias = name.substr(0, name.size() - 6) + "bias";
      tensors.emplace_back(bias, torch::zeros({t.size(0)}, t.options()));
    }
  }
  nlohmann::json config = gpt2_config_json(c, dtype);
  config.merge_patch(extras.config);
  save_hf_folder(config, tensors, folder, max_shard_bytes, extras.copy_files);
}

void save_hf_folder(const nlohmann::json& config, const StateDict& tensors, const fs::path& given,
                    int64_t max_shard_bytes, const std::vector<fs::path>& copy_files) {
  const fs::path folder = without_trailing_slash(given);
  if (max_shard_bytes < 1)
    throw Error(folder.string() + ": max_shard_bytes " + std::to_string(max_shard_bytes) +
                " is not positive");
  // Only an earlier export is replaced: never a downloaded model's folder or another's files.
  check_export_folder(folder, "the export's folder");
  const bool replace = fs::exists(folder) && !fs::is_empty(folder);
  for (const fs::path& f : copy_files)
    if (!fs::is_regular_file(f))
      throw Error(f.string() + ": no such file to copy into " + folder.string());
  const fs::path parent = folder.has_parent_path() ? folder.parent_path() : fs::path(".");
  const std::string name = folder.filename().string();
  const fs::path tmp = parent / ("." + name + ".partial");
  const fs::path old = parent / ("." + name + ".old");
  remove_or_throw(tmp);
  remove_or_throw(old);
  try {
    write_folder(config, tensors, tmp, max_shard_bytes, copy_files);
    if (replace) {
      // The old folder's other files (tokenizer.json, ...) and folders stay; its weights, and an
      // earlier adapter export's files, go.
      for (const auto& entry : fs::directory_iterator(folder)) {
        const std::string n = entry.path().filename().string();
        if (is_model_export_file(n) || is_adapter_export_file(n) || fs::exists(tmp / n)) continue;
        fs::copy(entry.path(), tmp / n,
                 fs::copy_options::recursive | fs::copy_options::copy_symlinks);
      }
    }
    sync_directory(tmp);
    if (fs::exists(folder)) fs::rename(folder, old);
    fs::rename(tmp, folder);
    sync_directory(parent);
  } catch (const fs::filesystem_error& e) {
    std::error_code ec;
    remove_tree(tmp, ec);
    throw Error("cannot write " + folder.string() + ": " + e.what());
  }
  remove_or_throw(old);
}

namespace {

void write_folder(const nlohmann::json& config, const StateDict& tensors, const fs::path& tmp,
                  int64_t max_shard_bytes, const std::vector<fs::path>& copy_files) {
  fs::create_directories(tmp);

  // Shards as transformers makes them: in order, a new one when the next tensor would not fit.
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (const auto& [n, t] : tensors) {
    const int64_t bytes = static_cast<int64_t>(t.numel() * t.element_size());
    if (!shards.back().empty() && in_shard + bytes > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().emplace_back(n, t);
    in_shard += bytes;
    total += bytes;
  }
  const std::map<std::string, std::string>& metadata = export_metadata();
  if (shards.size() == 1) {
    save_safetensors(tmp / "model.safetensors", shards[0], metadata);
  } else {
    nlohmann::json index = {{"metadata", {{"total_size", total}}},
                            {"weight_map", nlohmann::json::object()}};
    const std::string count = std::to_string(shards.size());
    for (size_t i = 0; i < shards.size(); ++i) {
      std::string file = std::to_string(i + 1);
      file = "model-" + std::string(5 - std::min<size_t>(5, file.size()), '0') + file + "-of-" +
             std::string(5 - std::min<size_t>(5, count.size()), '0') + count + ".safetensors";
      save_safetensors(tmp / file, shards[i], metadata);
      for (const auto& [n, t] : shards[i]) index["weight_map"][n] = file;
    }
    write_file_atomically(tmp / "model.safetensors.index.json", index.dump(2) + "\n");
  }
  write_file_atomically(tmp / "config.json", config.dump(2) + "\n");
  for (const fs::path& f : copy_files)
    fs::copy_file(f, tmp / f.filename(), fs::copy_options::overwrite_existing);
}

}  // namespace

}  // namespace fabric::hf
