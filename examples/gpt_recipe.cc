#include "examples/gpt_recipe.h"

#include <algorithm>
#include <string>

#include "fabric/config/standard_keys.h"
#include "fabric/core/error.h"
#include "fabric/hf/export.h"

namespace examples::gpt {

fabric::ConfigSchema schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.set_default("data.root", "\"\"");
  s.set_default("scheduler.monitor", "val/loss");  // plateau: the loss at gpt.eval_every_n_steps
  s.add("data.token_dtype",
        fabric::KeySpec::choice({"uint16", "uint32"}, "uint16")
            .doc("ids in train.bin/val.bin (uint32 for vocabularies over 65,535)"));
  s.section_doc("model",
                "fabric::models::GPT: a preset, any field overridden (0: the preset's); or a "
                "Hugging Face model folder (model.pretrained)");
  s.add("model.pretrained",
        fabric::KeySpec::string("").doc(
            "a Hugging Face model folder (config.json, model.safetensors or its index and "
            "shards): llama, qwen2, mistral or gpt2, its architecture and weights (the size keys "
            "below must stay unset; model.block_size is the training window)"));
  s.add("model.preset",
        fabric::KeySpec::choice({"tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}, "tiny"));
  s.add("model.vocab_size", fabric::KeySpec::integer(0).min(0).doc(
                                "0: data.root/meta.json's vocab_size padded up to a multiple "
                                "of 64, else the preset's"));
  s.add("model.block_size",
        fabric::KeySpec::integer(0).min(0).doc(
            "tokens per sequence (with model.pretrained: at most the model's positions; 0: the "
            "smaller of them and 1024)"));
  s.add("model.n_layer", fabric::KeySpec::integer(0).min(0).max(4096));  // more: a typo
  s.add("model.n_head", fabric::KeySpec::integer(0).min(0));
  s.add("model.n_embd", fabric::KeySpec::integer(0).min(0));
  s.add("model.dropout", fabric::KeySpec::real(0.0).min(0).max(1, false));
  s.add("model.bias", fabric::KeySpec::boolean(true).doc("biases in the Linear layers"));
  s.add("model.fused_loss", fabric::KeySpec::boolean(true).doc(
                                "output layer + cross-entropy fused on GPUs (no float32 logits)"));
  s.add("model.fused_layer_norm",
        fabric::KeySpec::boolean(true).doc(
            "LayerNorms (the GPT's) and RMSNorms (the Llama family's), + residual add, as fused "
            "CUDA kernels with 16-bit outputs where they apply (CUDA, bf16/fp16 autocast); "
            "false: the ATen formulas"));
  s.add("model.fused_elementwise",
        fabric::KeySpec::boolean(true).doc(
            "the Llama family's rotary embedding and SwiGLU as fused CUDA kernels where they "
            "apply (CUDA, 16-bit); false: ATen's operators (no effect on the GPT)"));
  s.add("model.activation_checkpointing",
        fabric::KeySpec::choice_list({"Block", "LlamaDecoderLayer"}, {})
            .doc("module types whose activations are recomputed in backward instead of kept "
                 "(the GPT's Block, the Llama family's LlamaDecoderLayer)"));
  s.add("gpt.eval_every_n_steps", fabric::KeySpec::integer(0).min(0).doc(
                                      "validation loss every N optimizer steps (0: at the end)"));
  s.add("gpt.prompt",
        fabric::KeySpec::string("def ").doc("the start of the sample printed at the end"));
  s.add("gpt.sample_tokens", fabric::KeySpec::integer(200).min(0).doc("0: no sample"));
  s.add("gpt.temperature", fabric::KeySpec::real(0.8).min(0, false));
  s.add("gpt.top_k", fabric::KeySpec::integer(40).min(0).doc("0: the whole vocabulary"));
  s.add("gpt.corpus_cache",
        fabric::KeySpec::string("").doc("where the default corpus is prepared; \"\": "
                                        "$XDG_CACHE_HOME/fabricpp, else ~/.cache/fabricpp"));
  return s;
}

fabric::models::GPTConfig model_config(const fabric::Config& c, int64_t meta_vocab) {
  auto m = fabric::models::GPTConfig::preset(c.get_string("model.preset"));
  auto set = [&](const char* key, int64_t& field) {
    if (c.get_int(key) > 0) field = c.get_int(key);
  };
  // The data's vocabulary padded up to a multiple of 64, as nanoGPT's 50304 for GPT-2's 50257:
  // GEMMs of that width run faster, and tp (up to 64) divides it. The ids above the data's are
  // never targets and never sampled (gpt_text.cc).
  if (meta_vocab > 0) m.vocab_size = (meta_vocab + 63) / 64 * 64;
  set("model.vocab_size", m.vocab_size);
  set("model.block_size", m.block_size);
  set("model.n_layer", m.n_layer);
  set("model.n_head", m.n_head);
  set("model.n_embd", m.n_embd);
  m.dropout = c.get_double("model.dropout");
  m.bias = c.get_bool("model.bias");
  m.fused_loss = c.get_bool("model.fused_loss");
  m.fused_layer_norm = c.get_bool("model.fused_layer_norm");
  // A config error (exit 2; fabric.max_restarts never restarts it), found before any work.
  if (m.n_embd % m.n_head != 0) {
    const std::string why = " (the width splits evenly into the attention heads)";
    if (c.get_int("model.n_embd") > 0)
      throw c.error_at("model.n_embd", std::to_string(m.n_embd) +
                                           " is not a multiple of model.n_head " +
                                           std::to_string(m.n_head) + why);
    throw c.error_at("model.n_head", std::to_string(m.n_head) + " does not divide model.n_embd " +
                                         std::to_string(m.n_embd) + why);
  }
  return m;
}

int64_t ModelChoice::vocab_size() const {
  return is_llama() ? pretrained->vocab_size() : gpt.vocab_size;
}

int64_t ModelChoice::positions() const {
  return is_llama() ? pretrained->max_positions() : gpt.block_size;
}

int64_t ModelChoice::parameters() const {
  return is_llama() ? pretrained->parameters() : gpt.parameters();
}

double ModelChoice::flops_per_token() const {
  if (is_llama()) return pretrained->llama->flops_per_token(window);
  const double n = static_cast<double>(gpt.parameters() - gpt.block_size * gpt.n_embd);
  return 6 * n + 12.0 * static_cast<double>(gpt.n_layer * gpt.n_embd * window);
}

std::string ModelChoice::describe(const fabric::Config& c) const {
  std::string s = std::to_string(parameters()) + " parameters (";
  if (pretrained) {
    s += pretrained->describe() + ", from " + pretrained->folder.string();
  } else {
    s += c.get_string("model.preset") + ": " + std::to_string(gpt.n_layer) + " layers, " +
         std::to_string(gpt.n_head) + " heads, width " + std::to_string(gpt.n_embd) + ", " +
         std::to_string(gpt.block_size) + " positions, vocabulary " +
         std::to_string(gpt.vocab_size);
  }
  return s + "), sequences of " + std::to_string(window) + " tokens";
}

namespace {

// model.activation_checkpointing names the block type of the model the run trains.
void check_checkpointed_blocks(const fabric::Config& c, const ModelChoice& m) {
  const std::string own = m.is_llama() ? "LlamaDecoderLayer" : "Block";
  for (const std::string& b : c.get_string_list("model.activation_checkpointing"))
    if (b != own)
      throw c.error_at("model.activation_checkpointing",
                       b + " is not a block of this model (" +
                           (m.pretrained ? m.pretrained->model_type : std::string("the GPT")) +
                           "'s is " + own + ")");
}

}  // namespace

ModelChoice choose_model(const fabric::Config& c, int64_t meta_vocab) {
  ModelChoice m;
  const std::string folder = c.get_string("model.pretrained");
  if (folder.empty()) {
    m.gpt = model_config(c, meta_vocab);
    m.window = m.gpt.block_size;
    check_checkpointed_blocks(c, m);
    return m;
  }
  // The architecture is the folder's: a size key given too would be silently ignored.
  for (const char* key : {"model.preset", "model.vocab_size", "model.n_layer", "model.n_head",
                          "model.n_embd", "model.bias"})
    if (c.origin(key) != "default")
      throw c.error_at(key, "set together with model.pretrained (" + c.origin("model.pretrained") +
                                "), whose config.json decides the architecture; remove " + key);
  try {
    m.pretrained = fabric::hf::read_pretrained(folder);
  } catch (const fabric::Error& e) {
    throw c.error_at("model.pretrained", e.what());
  }
  if (m.pretrained->llama) {
    m.pretrained->llama->fused_norm = c.get_bool("model.fused_layer_norm");
    m.pretrained->llama->fused_elementwise = c.get_bool("model.fused_elementwise");
  }
  const fabric::hf::Pretrained& p = *m.pretrained;
  if (p.gpt2) {
    m.gpt = *p.gpt2;
    if (c.origin("model.dropout") != "default") m.gpt.dropout = c.get_double("model.dropout");
    m.gpt.fused_loss = c.get_bool("model.fused_loss");
    m.gpt.fused_layer_norm = c.get_bool("model.fused_layer_norm");
  } else if (c.get_double("model.dropout") > 0) {
    throw c.error_at("model.dropout", "the Llama family (" + p.model_type +
                                          ") has no dropout; remove model.dropout");
  }
  const int64_t positions = m.positions();
  m.window = c.get_int("model.block_size") > 0 ? c.get_int("model.block_size")
                                               : std::min<int64_t>(positions, 1024);
  if (m.window > positions)
    throw c.error_at("model.block_size",
                     std::to_string(m.window) + " is more than the " + std::to_string(positions) +
                         " positions of " + (p.folder / "config.json").string() +
                         "; train on windows of at most " + std::to_string(positions));
  if (p.llama && p.llama->sliding_window > 0 && m.window > p.llama->sliding_window)
    throw c.error_at("model.block_size",
                     std::to_string(m.window) + " is more than the sliding window (" +
                         std::to_string(p.llama->sliding_window) + ", not implemented) of " +
                         (p.folder / "config.json").string() +
                         "; train on windows of at most that");
  if (meta_vocab > m.vocab_size())
    throw c.error_at("model.pretrained",
                     "the data's vocabulary (" + std::to_string(meta_vocab) +
                         " ids, data.root/meta.json) does not fit the model's " +
                         std::to_string(m.vocab_size()) + " (" +
                         (p.folder / "config.json").string() +
                         "); prepare the data with tools/prepare_text --tokenizer=" +
                         (p.folder / "tokenizer.json").string());
  check_checkpointed_blocks(c, m);
  return m;
}

void export_hf(const fabric::Config& c, const ModelChoice& m, const fabric::StateDict& whole,
               const std::filesystem::path& folder) {
  const auto shard = static_cast<int64_t>(c.get_double("checkpoint.export_shard_gb") * 1e9);
  fabric::hf::ExportExtras extras;
  if (m.pretrained) {
    const fabric::hf::Pretrained& p = *m.pretrained;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                             "chat_template.jinja", "generation_config.json"})
      if (std::filesystem::exists(p.folder / name)) extras.copy_files.push_back(p.folder / name);
    if (p.bos_token_id >= 0) extras.config["bos_token_id"] = p.bos_token_id;
    if (p.eos_token_ids.size() == 1) extras.config["eos_token_id"] = p.eos_token_ids[0];
    if (p.eos_token_ids.size() > 1) extras.config["eos_token_id"] = p.eos_token_ids;
    if (p.pad_token_id >= 0) extras.config["pad_token_id"] = p.pad_token_id;
  }
  if (m.is_llama()) {
    fabric::hf::save_llama(*m.pretrained->llama, whole, folder, shard, extras);
  } else {
    fabric::hf::save_gpt2(m.gpt, whole, folder, shard, extras);
  }
}

}  // namespace examples::gpt
