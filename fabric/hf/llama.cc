#include "fabric/hf/llama.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fabric/core/error.h"
#include "fabric/hf/weights.h"

namespace fabric::hf {

namespace fs = std::filesystem;
using fabric::models::LlamaConfig;

namespace {

// Typed reads of config.json's keys, each error "PATH: KEY: problem; fix".
class Reader {
 public:
  Reader(const nlohmann::json& json, std::string path) : json_(json), path_(std::move(path)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw Error(path_ + ": " + key + ": " + problem);
  }
  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }
  const nlohmann::json& at(const std::string& key) const { return json_[key]; }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, "missing; a Llama-family config.json names it");
    }
    if (!json_[key].is_number_integer()) fail(key, json_[key].dump() + " is not an integer");
    return json_[key].get<int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_number()) fail(key, json_[key].dump() + " is not a number");
    return json_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_boolean()) fail(key, json_[key].dump() + " is not true or false");
    return json_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_string()) fail(key, json_[key].dump() + " is not a string");
    return json_[key].get<std::string>();
  }

 private:
  const nlohmann::json& json_;
  std::string path_;
};

// The rotary settings: transformers 5's rope_parameters (rope_theta inside), else transformers 4's
// rope_scaling (null for none) beside a top-level rope_theta.
void read_rope(const Reader& r, const nlohmann::json& top, const std::string& path,
               LlamaConfig& c) {
  c.rope_theta = r.number("rope_theta", 10000.0);
  const char* key = r.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (!r.has(key)) return;
  if (!top[key].is_object()) r.fail(key, top[key].dump() + " is not an object");
  const Reader rope(top[key], path);
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
  const fs::path path = fs::is_directory(given) ? given / "config.json" : given;
  std::ifstream in(path);
  if (!in) throw Error(path.string() + ": cannot read; give a Hugging Face model's config.json");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    throw Error(path.string() + ": not a JSON object; give a Hugging Face model's config.json");
  const Reader r(json, path.string());
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
  read_rope(r, json, path.string(), c);
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
  if (sliding && r.has("sliding_window")) c.sliding_window = r.integer("sliding_window");
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(path.string() + ": " + e.what());
  }
  return c;
}

void load_llama_weights(fabric::models::LlamaImpl& model, const fs::path& folder) {
  const bool tied = model.config().tie_word_embeddings;
  load_weights(model, read_weights(folder), folder, [&](const std::string& name) {
    const std::string inv_freq = "rotary_emb.inv_freq";
    return (tied && name == "lm_head.weight") ||
           (name.size() >= inv_freq.size() &&
            name.compare(name.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0);
  });
}

fabric::models::Llama load_llama(const fs::path& folder) {
  if (!fs::is_directory(folder))
    throw Error(folder.string() + ": no such folder; give a Hugging Face model folder");
  fabric::models::Llama model(read_llama_config(folder / "config.json"));
  load_llama_weights(*model, folder);
  return model;
}

}  // namespace fabric::hf
