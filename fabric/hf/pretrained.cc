#include "fabric/hf/pretrained.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/core/json_object.h"
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
  p.model_type = json.value("model_type", std::string());
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
  // tokenizer_config.json's add_bos_token: whether the folder's own tokenizer puts bos first.
  if (std::ifstream tc(folder / "tokenizer_config.json"); tc) {
    const auto j = nlohmann::json::parse(tc, nullptr, /*allow_exceptions=*/false);
    p.add_bos_token = j.is_object() && j.value("add_bos_token", false) == true;
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
