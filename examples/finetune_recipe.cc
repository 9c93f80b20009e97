#include "examples/finetune_recipe.h"

#include <torch/nn/module.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "examples/finetune_demo.h"
#include "examples/gpt_text.h"
#include "fabric/config/standard_keys.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/data/chat_template.h"
#include "fabric/data/instruct.h"

namespace examples::finetune {

namespace fs = std::filesystem;
using fabric::KeySpec;

fabric::ConfigSchema schema() {
  fabric::ConfigSchema s = fabric::training_schema();
  s.set_default("checkpoint.export_weights", "\"{run_dir}/export\"");
  s.set_default("checkpoint.export_format", "hf");
  s.section_doc("model", "the Hugging Face folder to fine-tune");
  s.add("model.pretrained",
        KeySpec::string("").doc("a llama, qwen2, mistral or gpt2 folder (config.json, "
                                "safetensors, tokenizer.json); \"\": the offline demo (a tiny "
                                "model it builds)"));
  s.add("model.activation_checkpointing",
        KeySpec::choice_list({"LlamaDecoderLayer", "Block"}, {})
            .doc("decoder layers whose activations are recomputed in backward"));
  s.add("data.train",
        KeySpec::string("").doc("JSONL, one example a line (fabric/data/instruct.h)"));
  s.add("data.val", KeySpec::string("").doc("JSONL for the validation loss; \"\": none"));
  s.add("data.template",
        KeySpec::string("alpaca").doc("alpaca | chatml | chat_template (the model folder's own) | "
                                      "a FILE.jinja | a TEXT with {prompt} and {response}"));
  s.add("data.packed", KeySpec::boolean(false).doc(
                           "join the examples into windows of data.block_size (else one example "
                           "a row, padded to the batch's longest)"));
  s.add("data.block_size", KeySpec::integer(512).min(8).doc("the longest input the model sees"));
  s.add("data.token_cache",
        KeySpec::string("auto").doc("where tokenized JSONL files are kept between runs; auto: "
                                    "~/.cache/fabricpp/instruct; none: not kept"));
  s.add("data.add_bos", KeySpec::choice({"auto", "true", "false"}, "auto")
                            .doc("the bos id first; auto: tokenizer_config.json's add_bos_token, "
                                 "else tokenizer.json's template (Llama 3)"));
  s.section_doc("finetune", "what trains (examples/finetune.cc)");
  s.add("finetune.method", KeySpec::choice({"lora", "full"}, "lora"));
  s.add("finetune.lora.rank", KeySpec::integer(8).min(1));
  s.add("finetune.lora.alpha", KeySpec::real(16.0).min(0, false).doc("scaling alpha / rank"));
  s.add("finetune.lora.dropout", KeySpec::real(0.05).min(0).max(1, false));
  s.add("finetune.lora.target_modules",
        KeySpec::string_list({"q_proj", "v_proj"})
            .doc("Linear layers by name: a name's last components, '*' any one component"));
  s.add("finetune.lora.merge_on_export",
        KeySpec::boolean(false).doc("export the merged model folder instead of the adapter"));
  s.add("finetune.lora.base_dtype",
        KeySpec::choice({"auto", "bf16", "fp8"}, "auto")
            .doc("the adapted layers' frozen weights: as the precision keeps parameters, "
                 "bfloat16, or float8 e4m3 with a scale per output row (fabric/nn/lora.h)"));
  s.add("finetune.eval_every_n_steps",
        KeySpec::integer(0).min(0).doc("validation loss every N steps (0: at the end only)"));
  s.add("finetune.sample_prompt",
        KeySpec::string("").doc("answered greedily at the end (rendered by data.template)"));
  s.add("finetune.sample_tokens", KeySpec::integer(48).min(0));
  s.add("finetune.demo_cache",
        KeySpec::string("").doc("where the offline demo is written (\"\": ~/.cache/fabricpp)"));
  return s;
}

fs::path demo_cache(const fabric::Config& c) {
  const std::string given = c.get_string("finetune.demo_cache");
  return given.empty() ? examples::gpt::cache_home()
                       : fabric::absolute_from_working_directory(given);
}

std::shared_ptr<torch::nn::Module> trainable_tree(torch::nn::Module& model) {
  auto root = std::make_shared<torch::nn::Module>();
  for (auto& p : model.named_parameters()) {
    if (!p.value().requires_grad()) continue;
    const std::string& name = p.key();
    torch::nn::Module* at = root.get();
    size_t begin = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', begin)) {
      const std::string part = name.substr(begin, dot - begin);
      auto children = at->named_children();
      at = children.contains(part)
               ? children[part].get()
               : at->register_module(part, std::make_shared<torch::nn::Module>()).get();
      begin = dot + 1;
    }
    at->register_parameter(name.substr(begin), p.value());
  }
  return root;
}

fabric::nn::LoraOptions lora_options(const fabric::Config& c) {
  fabric::nn::LoraOptions o;
  o.rank = c.get_int("finetune.lora.rank");
  o.alpha = c.get_double("finetune.lora.alpha");
  o.dropout = c.get_double("finetune.lora.dropout");
  o.target_modules = c.get_string_list("finetune.lora.target_modules");
  o.base_dtype = fabric::nn::parse_lora_base_dtype(c.get_string("finetune.lora.base_dtype"));
  return o;
}

std::vector<int64_t> sample_ids(const fabric::Config& c, const Inputs& in) {
  const std::string& tmpl = in.options.template_text;
  const std::string prompt = c.get_string("finetune.sample_prompt");
  std::string text;       // the prompt as the template renders it
  if (in.options.chat) {  // one user message and the generation prompt
    text = in.options.chat->render(
        nlohmann::ordered_json::array({{{"role", "user"}, {"content", prompt}}}), true);
  } else {
    const std::string line = nlohmann::json({{"prompt", prompt}, {"response", ""}}).dump();
    for (const auto& [part, response] :
         fabric::render_instruct_example(line, tmpl, "finetune.sample"))
      if (!response) text += part;
  }
  std::vector<int64_t> ids = in.tokenizer->encode(text);
  const int64_t bos = in.tokenizer->bos();
  if (in.options.add_bos && bos >= 0 && (ids.empty() || ids.front() != bos))
    ids.insert(ids.begin(), bos);
  return ids;
}

Inputs open_inputs(fabric::Fabric& f) {
  const fabric::Config& c = f.config();
  // The model folder and the data: given, or the demo's.
  fs::path folder = c.get_string("model.pretrained");
  fs::path train_file = c.get_string("data.train"), val_file = c.get_string("data.val");
  if (folder.empty()) {
    const examples::finetune::Demo demo =
        examples::finetune::prepare_demo(f, examples::finetune::demo_cache(c));
    folder = demo.model;
    if (train_file.empty()) train_file = demo.train;
    if (val_file.empty() && c.get_string("data.train").empty()) val_file = demo.val;
  } else {
    folder = fabric::absolute_from_working_directory(folder.string());
  }
  fabric::hf::Pretrained p;
  try {
    p = fabric::hf::read_pretrained(folder);
  } catch (const fabric::Error& e) {
    throw c.error_at("model.pretrained", e.what());
  }
  if (train_file.empty())
    throw c.error_at("data.train", "not set; give the JSONL file of training examples");
  std::string tmpl = c.get_string("data.template");
  const bool chat = fabric::ChatTemplate::named_by(tmpl);
  if (chat && tmpl != "chat_template")  // a FILE.jinja, from where the command ran
    tmpl = fabric::absolute_from_working_directory(tmpl).string();
  std::shared_ptr<const fabric::ChatTemplate> chat_template;
  try {  // the template, before any file is read
    fabric::check_instruct_template(tmpl);
    if (chat) chat_template = fabric::ChatTemplate::open(tmpl, folder);  // once, for all files
  } catch (const fabric::Error& e) {
    throw c.error_at("data.template", e.what());
  }
  const int64_t block = c.get_int("data.block_size");
  if (block > p.max_positions())
    throw c.error_at("data.block_size", std::to_string(block) + " exceeds the model's " +
                                            std::to_string(p.max_positions()) +
                                            " positions; lower it");
  // The decoder layers' type, as model.activation_checkpointing names it.
  const std::string layer = p.gpt2 ? "Block" : "LlamaDecoderLayer";
  for (const std::string& name : c.get_string_list("model.activation_checkpointing"))
    if (name != layer)
      throw c.error_at(
          "model.activation_checkpointing",
          name + " is not a layer of a " + p.model_type + " model; its layers are " + layer);

  fabric::InstructDataset::Options o;
  o.chat = chat_template;
  o.tokenizer_json = folder / "tokenizer.json";
  o.template_text = tmpl;
  o.block_size = block;
  o.packed = c.get_bool("data.packed");
  const auto tokenizer = std::make_shared<const fabric::BpeTokenizer>(
      fabric::BpeTokenizer::from_tokenizer_json(o.tokenizer_json));
  // auto: the bos when the folder asks for one and names it (never an error); a chat template
  // writes its own ("{{ bos_token }}"), as apply_chat_template adds no special tokens.
  const std::string add_bos = c.get_string("data.add_bos");
  o.add_bos =
      add_bos == "true" || (add_bos == "auto" && !chat && p.add_bos_token && tokenizer->bos() >= 0);
  try {  // ids the model has no row for would fail in the first forward
    fabric::hf::check_tokenizer_fits(p, tokenizer->vocab_size());
  } catch (const fabric::Error& e) {
    throw c.error_at("model.pretrained", e.what());
  }
  try {  // chatml's markers spelled out as text in every example
    fabric::check_template_tokens(o.template_text, *tokenizer, o.tokenizer_json.string());
  } catch (const fabric::Error& e) {
    throw c.error_at("data.template", e.what());
  }
  if (o.add_bos && tokenizer->bos() < 0)
    throw c.error_at("data.add_bos", "true, but " + folder.string() +
                                         " names no bos token (tokenizer_config.json bos_token); "
                                         "set data.add_bos=auto or false");
  const std::string token_cache = c.get_string("data.token_cache");
  if (token_cache == "auto")
    o.cache_dir = examples::gpt::cache_home() / "instruct";
  else if (token_cache != "none")
    o.cache_dir = fabric::absolute_from_working_directory(token_cache);
  // Each node's local rank 0 tokenizes (and caches) first; the others then read its cache.
  Inputs in{folder, p, o, tokenizer, nullptr, nullptr};
  auto& train_data = in.train;
  auto& val_data = in.val;
  // A file's error is the key's (exit 2: bad input, as the other keys').
  auto open_one = [&](const fs::path& file, const char* key) {
    try {
      return fabric::InstructDataset::open(file, o, tokenizer);
    } catch (const fabric::ConfigError&) {
      throw;
    } catch (const fabric::Error& e) {
      throw c.error_at(key, e.what());
    }
  };
  auto open_data = [&] {
    train_data = open_one(train_file, "data.train");
    if (!val_file.empty()) val_data = open_one(val_file, "data.val");
  };
  if (f.local_rank() == 0) open_data();
  f.barrier();
  if (f.local_rank() != 0) open_data();
  for (const auto* data : {train_data.get(), val_data.get()})
    if (data != nullptr && !data->unread_fields().empty())
      f.print("warning: keys no template reads, left out of the examples: ", data->unread_fields(),
              " (a line is prompt, input, response or messages; docs/finetune.md)");
  if (!train_data->cache_warning().empty())
    f.print("warning: data.token_cache: ", train_data->cache_warning(),
            " (tokenized again next run; set data.token_cache=DIR or none)");
  f.print(
      "data: ", train_data->examples().size(), " train examples (", train_data->truncated(),
      " cut to data.block_size ", block, ", ", train_data->dropped(),
      " dropped: no response token left), ", train_data->response_tokens(), " response tokens",
      train_data->from_cache() ? " (from the token cache)" : "", "; ",
      val_data ? std::to_string(val_data->examples().size()) : "no", " val examples; template ",
      [&] {
        std::string t = o.template_text;  // on one line
        for (size_t i = t.find('\n'); i != std::string::npos; i = t.find('\n', i + 2))
          t.replace(i, 1, "\\n");
        return t;
      }(),
      o.packed ? ", packed" : ", padded");
  // The sample's prompt, rendered now: a template that refuses it stops the run here, not after
  // training.
  if (!c.get_string("finetune.sample_prompt").empty()) {
    try {
      if (sample_ids(c, in).empty())
        throw fabric::Error("data.template renders it as nothing; give a longer prompt");
    } catch (const fabric::ConfigError&) {
      throw;
    } catch (const fabric::Error& e) {
      throw c.error_at("finetune.sample_prompt", e.what());
    }
  }
  return in;
}

}  // namespace examples::finetune
