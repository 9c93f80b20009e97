#include "examples/gpt_recipe.h"

#include <string>

#include "fabric/config/standard_keys.h"

namespace examples::gpt {

fabric::ConfigSchema schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.set_default("data.root", "\"\"");
  s.set_default("scheduler.monitor", "val/loss");  // plateau: the loss at gpt.eval_every_n_steps
  s.add("data.token_dtype",
        fabric::KeySpec::choice({"uint16", "uint32"}, "uint16")
            .doc("ids in train.bin/val.bin (uint32 for vocabularies over 65,535)"));
  s.section_doc("model", "fabric::models::GPT: a preset, any field overridden (0: the preset's).");
  s.add("model.preset",
        fabric::KeySpec::choice({"tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"}, "tiny"));
  s.add("model.vocab_size", fabric::KeySpec::integer(0).min(0).doc(
                                "0: data.root/meta.json's vocab_size padded up to a multiple "
                                "of 64, else the preset's"));
  s.add("model.block_size", fabric::KeySpec::integer(0).min(0).doc("tokens per sequence"));
  s.add("model.n_layer", fabric::KeySpec::integer(0).min(0));
  s.add("model.n_head", fabric::KeySpec::integer(0).min(0));
  s.add("model.n_embd", fabric::KeySpec::integer(0).min(0));
  s.add("model.dropout", fabric::KeySpec::real(0.0).min(0).max(1, false));
  s.add("model.bias", fabric::KeySpec::boolean(true).doc("biases in the Linear layers"));
  s.add("model.fused_loss", fabric::KeySpec::boolean(true).doc(
                                "output layer + cross-entropy fused on GPUs (no float32 logits)"));
  s.add("model.fused_layer_norm",
        fabric::KeySpec::boolean(true).doc(
            "LayerNorms (+ residual add) as fused CUDA kernels with 16-bit outputs where they "
            "apply (CUDA, bf16/fp16 autocast); false: ATen's LayerNorm"));
  s.add("model.activation_checkpointing",
        fabric::KeySpec::choice_list({"Block"}, {})
            .doc("module types whose activations are recomputed in backward instead of kept"));
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

}  // namespace examples::gpt
