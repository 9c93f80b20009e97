#include "fabric/hf/pretrained.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/core/json_object.h"
#include "fabric/hf/config_reader.h"
#include "fabric/hf/gpt2.h"
#include "fabric/hf/llama.h"

namespace fabric::hf {

namespace fs = std::filesystem;

namespace {

const char kCheckpointHint[] =
    " is a Fabric++ checkpoint, not a Hugging Face model folder: continue its run with "
    "checkpoint.resume=PATH, start from its weights with model.init_weights=PATH (after "
    "`ckpt consolidate`), or convert it with `bazel run //tools:ckpt -- hf PATH OUT` and give "
    "OUT to model.pretrained";

nlohmann::json read_json(const fs::path& path) { return read_json_object(path.string()); }

// A string member of an object, or "" (absent, or not a string).
std::string string_at(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

// The id tokenizer.json's post-processor puts first in a single sequence: a TemplateProcessing
// (alone or in a Sequence) whose template starts with a special token of one id. Llama 3's
// tokenizer adds its <|begin_of_text|> so (its tokenizer_config.json has no add_bos_token), and
// tokenizers' encode, so transformers', start with it. nullopt otherwise, or when the file is
// not readable JSON (its tokenizer reader says what is wrong). The vocabulary and merges (the bulk
// of the file) are skipped while parsing.
std::optional<int64_t> template_first_id(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in || !fs::is_regular_file(path)) return std::nullopt;
  const nlohmann::json j = nlohmann::json::parse(
      in,
      [](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        return !(event == nlohmann::json::parse_event_t::key && depth == 1 && parsed == "model");
      },
      /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("post_processor")) return std::nullopt;
  const nlohmann::json& post = j["post_processor"];
  std::vector<nlohmann::json> steps = {post};
  if (string_at(post, "type") == "Sequence" && post.contains("processors") &&
      post["processors"].is_array())
    steps.assign(post["processors"].begin(), post["processors"].end());
  for (const auto& step : steps) {
    if (string_at(step, "type") != "TemplateProcessing") continue;
    const nlohmann::json& single = step.contains("single") ? step["single"] : nlohmann::json();
    if (!single.is_array() || single.empty() || !single[0].is_object() ||
        !single[0].contains("SpecialToken"))
      return std::nullopt;
    const std::string token = string_at(single[0]["SpecialToken"], "id");
    const nlohmann::json& special =
        step.contains("special_tokens") ? step["special_tokens"] : nlohmann::json();
    if (!special.is_object() || !special.contains(token) || !special[token].is_object())
      return std::nullopt;
    const nlohmann::json& ids =
        special[token].contains("ids") ? special[token]["ids"] : nlohmann::json();
    if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_integer()) return std::nullopt;
    return ids[0].get<int64_t>();
  }
  return std::nullopt;
}

// An id or a list of ids (eos_token_id may be either); fabric::Error naming the key otherwise.
std::vector<int64_t> ids_of(const nlohmann::json& json, const char* key, const fs::path& path) {
  std::vector<int64_t> ids;
  if (!json.contains(key) || json[key].is_null()) return ids;
  const auto& v = json[key];
  auto one = [&](const nlohmann::json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw Error(path.string() + ": " + key + ": " + v.dump() +
                  " is not a token id (a non-negative integer or a list of them)");
    ids.push_back(x.get<int64_t>());
  };
  if (v.is_array()) {
    for (const auto& x : v) one(x);
  } else {
    one(v);
  }
  return ids;
}

// config.json's layer count and token embedding against the weights', before a caller builds a
// model of those sizes; weights that cannot be read are left to model_weights, which says why.
void check_sizes(const Pretrained& p) {
  Weights w;
  try {
    w = read_weights(p.folder);
  } catch (const Error&) {
    return;
  }
  if (p.llama) {
    check_llama_sizes(*p.llama, w, p.folder / "config.json");
  } else {
    check_gpt2_sizes(*p.gpt2, w, p.folder / "config.json");
  }
}

}  // namespace

int64_t Pretrained::vocab_size() const { return llama ? llama->vocab_size : gpt2->vocab_size; }

int64_t Pretrained::max_positions() const {
  return llama ? llama->max_position_embeddings : gpt2->block_size;
}

int64_t Pretrained::parameters() const { return llama ? llama->parameters() : gpt2->parameters(); }

std::string Pretrained::describe() const {
  std::string s = model_type;
  if (llama) {
    const auto& c = *llama;
    s += " (Llama family): " + std::to_string(c.num_hidden_layers) + " layers, " +
         std::to_string(c.num_attention_heads) + " heads (" +
         std::to_string(c.num_key_value_heads) + " key/value), width " +
         std::to_string(c.hidden_size) + ", " + std::to_string(c.max_position_embeddings) +
         " positions, vocabulary " + std::to_string(c.vocab_size) +
         (c.tie_word_embeddings ? ", tied output" : ", own output layer");
  } else {
    const auto& c = *gpt2;
    s += ": " + std::to_string(c.n_layer) + " layers, " + std::to_string(c.n_head) +
         " heads, width " + std::to_string(c.n_embd) + ", " + std::to_string(c.block_size) +
         " positions, vocabulary " + std::to_string(c.vocab_size);
  }
  return s;
}

Pretrained read_pretrained(const fs::path& folder) {
  if (!fs::exists(folder))
    throw Error(folder.string() +
                ": no such folder; give a Hugging Face model folder "
                "(config.json, model.safetensors, tokenizer.json)");
  if (!fs::is_directory(folder) || fs::exists(folder / kShardedManifest))
    throw Error(
        folder.string() +
        (fs::is_directory(folder) || folder.extension() == ".ckpt" || folder.extension() == ".pt"
             ? std::string(kCheckpointHint)
             : std::string(" is a file; give a Hugging Face model folder")));
  const fs::path config = folder / "config.json";
  if (!fs::exists(config))
    throw Error(folder.string() +
                ": no config.json; give a Hugging Face model folder (what "
                "save_pretrained or a download from the Hub writes)");
  const nlohmann::json json = read_json(config);
  Pretrained p;
  p.folder = folder;
  p.model_type = ConfigReader(json, config.string(), "").string("model_type", "");
  if (p.model_type == "llama" || p.model_type == "qwen2" || p.model_type == "mistral") {
    p.llama = read_llama_config(config);
  } else if (p.model_type == "gpt2") {
    p.gpt2 = read_gpt2_config(config);
  } else {
    throw Error(config.string() + ": model_type: '" + p.model_type +
                "' is not supported (llama, qwen2, mistral, gpt2)");
  }
  const fs::path generation = folder / "generation_config.json";
  const nlohmann::json gen = fs::exists(generation) ? read_json(generation) : nlohmann::json{};
  auto pick = [&](const char* key) {
    if (gen.contains(key) && !gen[key].is_null()) return ids_of(gen, key, generation);
    return ids_of(json, key, config);
  };
  p.eos_token_ids = pick("eos_token_id");
  if (const auto bos = pick("bos_token_id"); !bos.empty()) p.bos_token_id = bos.front();
  if (const auto pad = pick("pad_token_id"); !pad.empty()) p.pad_token_id = pad.front();
  // Whether the folder's own tokenizer puts bos first: tokenizer_config.json's add_bos_token
  // when it says (true or false), else tokenizer.json's post-processor template (then its id).
  std::optional<bool> said;
  if (std::ifstream tc(folder / "tokenizer_config.json"); tc) {
    const auto j = nlohmann::json::parse(tc, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("add_bos_token") && j["add_bos_token"].is_boolean())
      said = j["add_bos_token"].get<bool>();
  }
  if (said) {
    p.add_bos_token = *said;
  } else if (const auto first = template_first_id(folder / "tokenizer.json")) {
    p.add_bos_token = true;
    p.bos_token_id = *first;
  }
  check_sizes(p);
  return p;
}

void check_tokenizer_fits(const Pretrained& p, int64_t tokenizer_vocab_size) {
  if (tokenizer_vocab_size <= p.vocab_size()) return;
  throw Error((p.folder / "tokenizer.json").string() + ": its vocabulary (" +
              std::to_string(tokenizer_vocab_size) + " ids) does not fit the model's " +
              std::to_string(p.vocab_size()) + " (" + (p.folder / "config.json").string() +
              "); use the model's own tokenizer");
}

Weights model_weights(const Pretrained& p) {
  const Weights w = read_weights(p.folder);
  return p.gpt2 ? gpt2_weights(w) : llama_weights(w, *p.llama);
}

}  // namespace fabric::hf
