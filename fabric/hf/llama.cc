#include "fabric/hf/llama.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fabric/core/error.h"
#include "fabric/hf/config_reader.h"
#include "fabric/hf/weights.h"

namespace fabric::hf {

namespace fs = std::filesystem;
using fabric::models::LlamaConfig;

namespace {

using Reader = ConfigReader;

// The rotary settings: transformers 5's rope_parameters (rope_theta inside), else transformers 4's
// rope_scaling (null for none) beside a top-level rope_theta.
void read_rope(const Reader& r, const nlohmann::json& top, const std::string& path,
               LlamaConfig& c) {
  c.rope_theta = r.number("rope_theta", 10000.0);
  const char* key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!r.has(key)) return;
  if (!top[key].is_object()) r.fail(key, top[key].dump() + " is not an object");
  const Reader rope(top[key], path, "rope_type llama3 needs it");
  auto fail = [&](const std::string& sub, const std::string& problem) {
    r.fail(std::string(key) + "." + sub, problem);
  };
  c.rope_theta = rope.number("rope_theta", c.rope_theta);
  const std::string type = rope.string("rope_type", rope.string("type", "default"));
  if (type == "default") return;
  if (type != "llama3")
    fail("rope_type", "'" + type + "' is not supported (default, llama3); use a model without it");
  c.rope_type = type;
  auto need = [&](const char* name) {
    if (!rope.has(name)) fail(name, "missing; rope_type llama3 needs it");
    return rope.number(name, 0.0);
  };
  c.rope_factor = need("factor");
  c.rope_low_freq_factor = need("low_freq_factor");
  c.rope_high_freq_factor = need("high_freq_factor");
  if (!rope.has("original_max_position_embeddings"))
    fail("original_max_position_embeddings", "missing; rope_type llama3 needs it");
  c.rope_original_max_position_embeddings = rope.integer("original_max_position_embeddings");
  if (c.rope_high_freq_factor <= c.rope_low_freq_factor)
    fail("high_freq_factor", "must be larger than low_freq_factor");
}

}  // namespace

LlamaConfig read_llama_config(const fs::path& given) {
  const auto [json, path] = read_config_json(given);
  const Reader r(json, path, "a Llama-family config.json names it");
  LlamaConfig c;
  c.model_type = r.string("model_type", "");
  if (c.model_type != "llama" && c.model_type != "qwen2" && c.model_type != "mistral")
    r.fail("model_type",
           "'" + c.model_type + "' is not a Llama-family model (llama, qwen2, mistral)");
  c.vocab_size = r.integer("vocab_size");
  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  c.head_dim = r.integer("head_dim", 0);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.max_position_embeddings = r.integer("max_position_embeddings", 2048);
  read_rope(r, json, path, c);
  c.attention_bias = c.model_type != "qwen2" && r.boolean("attention_bias", false);
  c.qkv_bias = c.model_type == "qwen2";
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.torch_dtype = r.string("torch_dtype", r.string("dtype", "float32"));

  if (r.string("hidden_act", "silu") != "silu")
    r.fail("hidden_act", "'" + r.string("hidden_act", "") + "' is not supported (silu)");
  if (r.boolean("mlp_bias", false))
    r.fail("mlp_bias", "true is not supported; MLPs without biases");
  if (r.number("attention_dropout", 0.0) != 0.0)
    r.fail("attention_dropout", "attention dropout is not implemented; set it to 0.0");
  if (r.has("quantization_config"))
    r.fail("quantization_config", "quantized checkpoints are not read; use unquantized weights");
  // A sliding window: forward refuses sequences longer than it (there it would matter). Qwen2's
  // applies to the layers from max_window_layers on (transformers 5 lists them in layer_types).
  bool sliding = c.model_type == "mistral";
  if (c.model_type == "qwen2" && r.boolean("use_sliding_window", false))
    sliding = c.num_hidden_layers > r.integer("max_window_layers", 28);
  if (r.has("layer_types")) {
    if (!json["layer_types"].is_array()) r.fail("layer_types", "not a list");
    sliding = false;
    for (const auto& type : json["layer_types"]) {
      if (type == "sliding_attention") {
        sliding = true;
      } else if (type != "full_attention") {
        r.fail("layer_types",
               type.dump() + " is not supported (full_attention, sliding_attention)");
      }
    }
  }
  // The key absent: transformers' default window, 4096 (MistralConfig's and Qwen2Config's); null:
  // none.
  if (sliding)
    c.sliding_window = !json.contains("sliding_window") ? 4096
                       : r.has("sliding_window")        ? r.integer("sliding_window")
                                                        : 0;
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  return c;
}

Weights llama_weights(const Weights& folder, const fabric::models::LlamaConfig& config) {
  const std::string inv_freq = "rotary_emb.inv_freq";
  Weights kept;
  for (const auto& [name, tensor] : folder.tensors) {
    const bool rotary = name.size() >= inv_freq.size() &&
                        name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0;
    if (rotary || (config.tie_word_embeddings && name == "lm_head.weight")) continue;
    kept.file[name] = folder.file.at(name);
    kept.tensors.emplace_back(name, tensor);
  }
  return kept;
}

void load_llama_weights(fabric::models::LlamaImpl& model, const fs::path& folder) {
  load_weights(model, llama_weights(read_weights(folder), model.config()), folder);
}

fabric::models::Llama load_llama(const fs::path& folder) {
  if (!fs::is_directory(folder))
    throw Error(folder.string() + ": no such folder; give a Hugging Face model folder");
  const fabric::models::LlamaConfig config = read_llama_config(folder / "config.json");
  const Weights weights = read_weights(folder);
  check_llama_sizes(config, weights, folder / "config.json");
  fabric::models::Llama model(config);
  load_weights(*model, llama_weights(weights, config), folder);
  return model;
}

void check_llama_sizes(const fabric::models::LlamaConfig& config, const Weights& weights,
                       const fs::path& config_json) {
  check_config_sizes(weights, {.config = config_json,
                               .layer_prefixes = {"model.layers."},
                               .layers_key = "num_hidden_layers",
                               .layers = config.num_hidden_layers,
                               .embedding_names = {"model.embed_tokens.weight"},
                               .vocab_key = "vocab_size",
                               .width_key = "hidden_size",
                               .vocab = config.vocab_size,
                               .width = config.hidden_size});
}

}  // namespace fabric::hf
