#include "fabric/hf/gpt2.h"

#include <string>

#include "fabric/core/error.h"
#include "fabric/hf/config_reader.h"

namespace fabric::hf {

namespace fs = std::filesystem;
using fabric::models::GPTConfig;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GPTConfig read_gpt2_config(const fs::path& given) {
  const auto [json, path] = read_config_json(given);
  const ConfigReader r(json, path, "a GPT-2 config.json names it");
  const std::string type = r.string("model_type", "");
  if (type != "gpt2") r.fail("model_type", "'" + type + "' is not gpt2; give a GPT-2 folder");
  GPTConfig c;
  c.vocab_size = r.integer("vocab_size");
  c.n_embd = r.integer("n_embd");
  c.n_layer = r.integer("n_layer");
  c.n_head = r.integer("n_head");
  c.block_size = r.integer("n_positions");
  c.layer_norm_epsilon = r.number("layer_norm_epsilon", 1e-5);
  c.dropout = r.number("resid_pdrop", 0.1);
  c.bias = true;
  for (const char* key : {"vocab_size", "n_embd", "n_layer", "n_head", "n_positions"})
    if (r.integer(key) < 1) r.fail(key, std::to_string(r.integer(key)) + " is not positive");
  if (c.n_embd % c.n_head != 0)
    r.fail("n_embd",
           std::to_string(c.n_embd) + " is not a multiple of n_head " + std::to_string(c.n_head));
  if (c.layer_norm_epsilon <= 0) r.fail("layer_norm_epsilon", "must be positive");
  if (c.dropout < 0 || c.dropout >= 1) r.fail("resid_pdrop", "must be in [0, 1)");
  const std::string act = r.string("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.gelu = "tanh";
  } else if (act == "gelu") {
    c.gelu = "none";
  } else {
    r.fail("activation_function",
           "'" + act + "' is not supported (gelu_new, gelu_pytorch_tanh, gelu)");
  }
  if (r.has("n_inner") && r.integer("n_inner") != 4 * c.n_embd)
    r.fail("n_inner", std::to_string(r.integer("n_inner")) +
                          " is not supported: the MLP is 4 · n_embd = " +
                          std::to_string(4 * c.n_embd) + " wide; set it to null");
  if (!r.boolean("tie_word_embeddings", true))
    r.fail("tie_word_embeddings", "false is not supported: the GPT's output is tied to wte");
  if (!r.boolean("scale_attn_weights", true))
    r.fail("scale_attn_weights", "false is not supported: attention scales by 1/sqrt(head size)");
  for (const char* key :
       {"scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"})
    if (r.boolean(key, false)) r.fail(key, "true is not supported; set it to false");
  return c;
}

Weights gpt2_weights(const Weights& hf) {
  Weights w;
  for (const auto& [name, tensor] : hf.tensors) {
    const std::string bare = name.rfind("transformer.", 0) == 0 ? name.substr(12) : name;
    if (name == "lm_head.weight" || ends_with(bare, ".attn.bias") ||
        ends_with(bare, ".attn.masked_bias"))
      continue;
    const std::string ours = "transformer." + bare;
    const bool conv1d =
        bare.rfind("h.", 0) == 0 &&
        (ends_with(bare, ".attn.c_attn.weight") || ends_with(bare, ".attn.c_proj.weight") ||
         ends_with(bare, ".mlp.c_fc.weight") || ends_with(bare, ".mlp.c_proj.weight"));
    const auto file = hf.file.find(name);
    if (file != hf.file.end()) {
      if (w.file.count(ours))
        throw Error(file->second.string() + ": tensor " + name + " is also in " +
                    w.file[ours].string() + " as " + ours +
                    " (with and without transformer.); a folder holds each tensor once");
      w.file[ours] = file->second;
    }
    w.tensors.emplace_back(ours, conv1d && tensor.dim() == 2 ? tensor.t() : tensor);
  }
  return w;
}

void load_gpt2_weights(fabric::models::GPTImpl& model, const fs::path& folder) {
  load_weights(model, gpt2_weights(read_weights(folder)), folder);
}

fabric::models::GPT load_gpt2(const fs::path& folder) {
  if (!fs::is_directory(folder))
    throw Error(folder.string() + ": no such folder; give a Hugging Face model folder");
  const fabric::models::GPTConfig config = read_gpt2_config(folder / "config.json");
  const Weights weights = read_weights(folder);
  check_gpt2_sizes(config, weights, folder / "config.json");
  fabric::models::GPT model(config);
  load_weights(*model, gpt2_weights(weights), folder);
  return model;
}

void check_gpt2_sizes(const fabric::models::GPTConfig& config, const Weights& weights,
                      const fs::path& config_json) {
  check_config_sizes(weights, {.config = config_json,
                               .layer_prefixes = {"transformer.h.", "h."},
                               .layers_key = "n_layer",
                               .layers = config.n_layer,
                               .embedding_names = {"transformer.wte.weight", "wte.weight"},
                               .vocab_key = "vocab_size",
                               .width_key = "n_embd",
                               .vocab = config.vocab_size,
                               .width = config.n_embd});
}

}  // namespace fabric::hf
