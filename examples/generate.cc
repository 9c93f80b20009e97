// bazel run //examples:generate -- model.pretrained=DIR generate.prompt="TEXT" [key=value ...]
//
// Text from a Hugging Face model folder (Llama, Qwen2, Mistral or GPT-2; docs/pretrained.md):
// the prompt encoded by DIR/tokenizer.json (a bos id first when the tokenizer adds one:
// generate.add_bos; generate.template=chat_template: first rendered as a user message in the
// folder's chat template, with its generation prompt, fabric/data/chat_template.h), up to
// generate.max_new_tokens ids generated after it (greedy at generate.temperature 0, else sampled
// with generate.top_k / generate.top_p from generate.seed), stopping at an eos id of
// DIR/generation_config.json (else config.json). Prints the completion and the decode speed;
// generate.output=FILE also writes FILE as JSON: prompt_ids, ids (the new ids only), text (their
// decoding), and the timings.
//
// Both families decode with a key/value cache (fabric/models/llama_generate.h, gpt_generate.h)
// under single, ddp, fsdp and tensor parallelism; under sequence, context or pipeline parallelism
// every step runs the model's forward over the whole sequence through Fabric. fabric.precision and
// the strategy keys work as in training (fabric.precision=32-true: float32, as the parity checks
// use). profiler.enabled=true profiles the cached decode steps on the profiler.* schedule (traces
// in the run directory, the top ops printed). model.adapter=ADAPTER_DIR merges a peft LoRA adapter
// (adapter_config.json, adapter_model.safetensors: examples:finetune's export, or peft's
// save_pretrained) into the loaded weights before setup, as peft's merge_and_unload does; an
// adapter made for another base model is a one-line error naming both. Exit status:
// fabric/main.h (2: a config error, e.g. model.pretrained missing or unreadable).
#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "examples/common/decode.h"
#include "examples/common/parallel_keys.h"
#include "fabric/callbacks.h"
#include "fabric/checkpoint/output_check.h"
#include "fabric/config/standard_keys.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/data/bpe.h"
#include "fabric/data/chat_template.h"
#include "fabric/fabric.h"
#include "fabric/hf/pretrained.h"
#include "fabric/hf/weights.h"
#include "fabric/main.h"
#include "fabric/models/gpt.h"
#include "fabric/models/gpt_generate.h"
#include "fabric/models/llama.h"
#include "fabric/models/llama_generate.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/lora.h"

namespace fs = std::filesystem;
using fabric::KeySpec;

namespace {

fabric::ConfigSchema schema() {
  fabric::ConfigSchema s = fabric::default_schema();
  s.section_doc("model", "the model to generate with");
  s.add("model.pretrained",
        KeySpec::string("").doc("a Hugging Face model folder (config.json, model.safetensors or "
                                "its index and shards, tokenizer.json); required"));
  s.add("model.adapter",
        KeySpec::string("").doc(
            "a peft LoRA adapter folder (adapter_config.json, adapter_model.safetensors) trained "
            "on model.pretrained, merged into its weights before generating; \"\": none"));
  s.section_doc("generate", "what to generate (examples/generate.cc)");
  s.add("generate.prompt", KeySpec::string("").doc("the text to continue"));
  s.add("generate.template",
        KeySpec::string("none").doc(
            "none: the prompt as given; chat_template: the prompt as a user message in the "
            "folder's chat template, then its generation prompt (as apply_chat_template with "
            "add_generation_prompt); a FILE.jinja: that template"));
  s.add("generate.system",
        KeySpec::string("").doc("with generate.template: a system message before the prompt"));
  s.add("generate.max_new_tokens", KeySpec::integer(64).min(1));
  s.add("generate.temperature",
        KeySpec::real(0.0).min(0).doc("0: greedy (the likeliest id every step); else sampled"));
  s.add("generate.top_k", KeySpec::integer(0).min(0).doc("sampling: the k likeliest ids (0: all)"));
  s.add("generate.top_p",
        KeySpec::real(1.0).min(0, false).max(1).doc("sampling: the likeliest ids holding p"));
  s.add("generate.seed", KeySpec::integer(0).min(0).doc("sampling's random generator"));
  s.add("generate.add_bos",
        KeySpec::choice({"auto", "true", "false"}, "auto")
            .doc("put the bos id before the prompt; auto: tokenizer_config.json's "
                 "add_bos_token, else whether tokenizer.json's template starts with a special "
                 "token (Llama 3)"));
  s.add("generate.stop_at_eos",
        KeySpec::boolean(true).doc("stop at an eos id of generation_config.json / config.json"));
  s.add(
      "generate.output",
      KeySpec::string("").doc("a JSON file: prompt_ids, ids (the new ids), text; \"\": none; "
                              "an existing file is replaced only when an earlier output or empty"));
  fabric::add_profiler_keys(s);  // profiler.*: decode steps of the key/value-cached path
  return s;
}

// model.adapter: the adapter folded into `model`'s loaded weights (W + B A alpha / r), so that the
// strategy and the cached decode see a plain model. ConfigErrors at model.adapter.
template <typename Holder>
void merge_adapter(fabric::Fabric& f, const fabric::hf::Pretrained& p, Holder& model) {
  const fabric::Config& c = f.config();
  const fs::path dir = c.get_string("model.adapter");
  if (dir.empty()) return;
  if (fabric::has_meta_tensors(*model))
    throw c.error_at("model.adapter",
                     "not with fabric.empty_init: true (the adapter is merged into the loaded "
                     "weights before setup); set fabric.empty_init=false");
  fabric::nn::LoraOptions lora;
  std::vector<std::pair<std::string, torch::Tensor>> state;
  std::string trained_on;  // adapter_config.json's base_model_name_or_path
  try {
    lora = fabric::nn::read_lora_options(dir);
    state = fabric::nn::read_lora_state(dir);
    std::ifstream in(dir / "adapter_config.json");
    const auto config = nlohmann::json::parse(in);
    if (config.contains("base_model_name_or_path") && config["base_model_name_or_path"].is_string())
      trained_on = config["base_model_name_or_path"].get<std::string>();
  } catch (const fabric::Error& e) {
    throw c.error_at("model.adapter", e.what());
  } catch (const nlohmann::json::exception& e) {
    throw c.error_at("model.adapter", (dir / "adapter_config.json").string() + ": " + e.what());
  }
  const std::string bases = "adapter_config.json's base_model_name_or_path is '" + trained_on +
                            "', model.pretrained is " + p.folder.string();
  // Layers or shapes that differ: the adapter was made for another model.
  auto another = [&](const std::string& what) {
    return c.error_at("model.adapter", dir.string() + ": made for another base model (" + bases +
                                           "): " + what + "; give the base it was trained on");
  };
  try {
    fabric::nn::apply_lora(*model, lora);
  } catch (const fabric::Error& e) {
    throw another(e.what());
  }
  try {
    fabric::nn::load_lora_state(*model, state);
  } catch (const fabric::Error& e) {
    throw another(e.what());
  }
  const auto merged = fabric::nn::merge_lora(*model);
  // apply_lora froze the base; the model is plain again (fsdp shards what requires gradients).
  for (auto& t : model->parameters()) t.set_requires_grad(true);
  // The shapes fit; a name that differs is said (a folder moved, or a look-alike base).
  std::error_code ec;
  const bool same = trained_on.empty() || fs::equivalent(trained_on, p.folder, ec) ||
                    fs::path(trained_on).filename() == p.folder.filename() ||
                    fs::path(trained_on).parent_path().filename() == p.folder.filename();
  f.print("generate: model.adapter ", dir.string(), ": LoRA rank ", lora.rank, " on ",
          merged.size(), " layers, merged",
          same ? std::string() : "; note: " + bases + " (the shapes fit)");
}

// The folder's weights in `model`, set up: loaded after setup (each rank copies its part), or
// with model.adapter before it, the adapter merged into them.
template <typename Holder>
void load_and_set_up(fabric::Fabric& f, const fabric::hf::Pretrained& p,
                     const fabric::hf::Weights& weights, Holder& model) {
  if (f.config().get_string("model.adapter").empty()) {
    f.setup(model);
    f.load_weights(model, weights.tensors, p.folder.string());
    return;
  }
  f.load_weights(model, weights.tensors, p.folder.string());
  merge_adapter(f, p, model);
  f.setup(model);
}

// generate.output, checked before any work: never one of the inputs (the model or adapter folder),
// a checkpoint or a folder, and an existing file is replaced only when it is an earlier output of
// this program (a JSON object with prompt_ids and ids) or empty. ConfigErrors at generate.output.
void check_output(const fabric::Config& c, const fabric::hf::Pretrained& p) {
  const fs::path out = c.get_string("generate.output");
  if (out.empty()) return;
  std::vector<fabric::InputPath> inputs = {{p.folder, "model.pretrained"}};
  if (const std::string adapter = c.get_string("model.adapter"); !adapter.empty())
    inputs.push_back({adapter, "model.adapter"});
  try {
    fabric::check_output(out, "generate.output", inputs);
  } catch (const fabric::Error& e) {
    throw c.error_at("generate.output", e.what());
  }
  std::error_code ec;
  if (fs::exists(out, ec) && !(fs::is_regular_file(out, ec) && fs::file_size(out, ec) == 0)) {
    std::ifstream in(out);  // (an empty file, e.g. mktemp's, is free to write)
    const nlohmann::json old = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!old.is_object() || !old.contains("prompt_ids") || !old.contains("ids"))
      throw c.error_at("generate.output", out.string() +
                                              ": exists and is not an earlier output of "
                                              "generate (a JSON object with prompt_ids and ids); "
                                              "give a new file name or remove it");
  } else if (const fs::path dir = fs::absolute(out).parent_path(); !fs::is_directory(dir, ec)) {
    throw c.error_at("generate.output",
                     "cannot write " + out.string() + ": " + dir.string() + " is not a folder");
  }
}

int run(fabric::Fabric& f) {
  using Clock = std::chrono::steady_clock;
  const fabric::Config& c = f.config();
  fabric::hf::Pretrained p;
  try {
    p = fabric::hf::read_pretrained(c.get_string("model.pretrained"));
  } catch (const fabric::Error& e) {
    throw c.error_at("model.pretrained", e.what());
  }
  check_output(c, p);
  const fs::path tokenizer_json = p.folder / "tokenizer.json";
  if (!fs::exists(tokenizer_json))
    throw c.error_at("model.pretrained", tokenizer_json.string() +
                                             ": missing; generate reads the prompt and writes "
                                             "the text with the folder's tokenizer.json");
  const fabric::BpeTokenizer tokenizer = fabric::BpeTokenizer::from_tokenizer_json(tokenizer_json);
  try {
    fabric::hf::check_tokenizer_fits(p, tokenizer.vocab_size());
  } catch (const fabric::Error& e) {
    throw c.error_at("model.pretrained", e.what());
  }
  std::string prompt_text = c.get_string("generate.prompt");
  const std::string tmpl = c.get_string("generate.template");
  if (tmpl != "none") {  // the folder's chat format, as apply_chat_template renders it
    if (!fabric::ChatTemplate::named_by(tmpl))
      throw c.error_at("generate.template",
                       "'" + tmpl + "' is none, chat_template or a " + "FILE.jinja");
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!c.get_string("generate.system").empty())
      messages.push_back({{"role", "system"}, {"content", c.get_string("generate.system")}});
    messages.push_back({{"role", "user"}, {"content", prompt_text}});
    try {
      prompt_text =
          fabric::ChatTemplate::open(tmpl == "chat_template"
                                         ? tmpl
                                         : fabric::absolute_from_working_directory(tmpl).string(),
                                     p.folder, "set generate.template to none or a FILE.jinja")
              ->render(messages, true);
    } catch (const fabric::Error& e) {
      throw c.error_at("generate.template", e.what());
    }
    if (prompt_text.empty())
      throw c.error_at("generate.template",
                       "renders nothing for a user message; give a chat template that writes "
                       "the conversation (or none)");
  } else if (!c.get_string("generate.system").empty()) {
    throw c.error_at("generate.system",
                     "set, but generate.template is none (a system message needs a chat format)");
  }
  std::vector<int64_t> prompt_ids = tokenizer.encode(prompt_text);
  // auto: the tokenizer's own choice; a chat template writes its own bos ("{{ bos_token }}").
  const std::string add_bos = c.get_string("generate.add_bos");
  if (add_bos == "true" || (add_bos == "auto" && tmpl == "none" && p.add_bos_token)) {
    const int64_t bos = p.bos_token_id >= 0 ? p.bos_token_id : tokenizer.bos();
    if (bos < 0)
      throw c.error_at("generate.add_bos", "true, but " + p.folder.string() +
                                               " names no bos token; set generate.add_bos=false");
    // never twice under a template; without one, as tokenizers does (a bos in the text stays)
    if (tmpl == "none" || prompt_ids.empty() || prompt_ids.front() != bos)
      prompt_ids.insert(prompt_ids.begin(), bos);
  }
  if (prompt_ids.empty()) {
    const bool bos = p.bos_token_id >= 0 || tokenizer.bos() >= 0;
    throw c.error_at("generate.prompt",
                     bos ? "empty, and generate.add_bos puts no bos id first; give some text or "
                           "set generate.add_bos=true"
                         : "empty, and the model has no bos id to start from; give some text");
  }
  fabric::models::GenerateOptions o;
  o.max_new_tokens = c.get_int("generate.max_new_tokens");
  o.temperature = c.get_double("generate.temperature");
  o.top_k = c.get_int("generate.top_k");
  o.top_p = c.get_double("generate.top_p");
  o.seed = static_cast<uint64_t>(c.get_int("generate.seed"));
  if (c.get_bool("generate.stop_at_eos")) o.eos_token_ids = p.eos_token_ids;
  o.pad_token_id = p.pad_token_id;
  const int64_t positions = p.max_positions();
  if (static_cast<int64_t>(prompt_ids.size()) >= positions)
    throw c.error_at("generate.prompt",
                     std::to_string(prompt_ids.size()) + " ids fill the model's " +
                         std::to_string(positions) +
                         " positions, leaving none for new ids; give a shorter prompt");
  if (static_cast<int64_t>(prompt_ids.size()) + o.max_new_tokens > positions)
    throw c.error_at("generate.max_new_tokens",
                     std::to_string(o.max_new_tokens) + " new ids after the prompt's " +
                         std::to_string(prompt_ids.size()) + " exceed the model's " +
                         std::to_string(positions) + " positions; ask for at most " +
                         std::to_string(positions - static_cast<int64_t>(prompt_ids.size())));

  const fabric::hf::Weights weights = fabric::hf::model_weights(p);
  std::vector<int64_t> ids;
  double prefill_s = 0, decode_s = 0, decode_rate = 0;
  const auto start = Clock::now();
  const std::string strategy = f.strategy().name();
  // The cached decode reads the layers directly (examples/common/decode.h says where it runs).
  const bool whole = examples::cached_decode_runs(f);
  auto decode = [&](auto& model) {
    load_and_set_up(f, p, weights, model);
    if (!whole) {
      ids = examples::generate_uncached(f, model, prompt_ids, positions, o);
      return;
    }
    // profiler.enabled: the decode steps on its schedule, its table printed at the end.
    std::shared_ptr<fabric::ProfilerCallback> profiler;
    if (auto po = fabric::profiler_options(c)) {
      profiler = std::make_shared<fabric::ProfilerCallback>(*po);
      o.on_step = [&f, profiler](int64_t s) { profiler->on_train_batch_end(f, s, {}); };
    }
    auto guard = f.autocast();
    const auto out = fabric::models::generate(*model, {prompt_ids}, o);
    ids = out.tokens[0];
    prefill_s = out.prefill_seconds;
    decode_s = out.decode_seconds;
    decode_rate = out.decode_tokens_per_second;
    if (profiler) profiler->on_fit_end(f);
  };
  if (p.llama) {
    auto model = f.init_module([&] { return fabric::models::Llama(*p.llama); });
    decode(model);
  } else {
    auto model = f.init_module([&] { return fabric::models::GPT(*p.gpt2); });
    decode(model);
  }
  const double total_s = std::chrono::duration<double>(Clock::now() - start).count();
  if (decode_rate == 0 && ids.size() > 1) decode_rate = static_cast<double>(ids.size()) / total_s;
  const std::string text = tokenizer.decode_text(ids);  // as `tokenizers` decodes them
  f.print(c.get_string("generate.prompt"), text);
  f.print("generate: ", prompt_ids.size(), " prompt ids, ", ids.size(), " new ids; decode ",
          decode_rate, " tokens/s", whole ? " (key/value cache)" : " (no cache)", "; ",
          p.describe(), "; strategy ", strategy, ", precision ",
          fabric::to_string(f.precision().mode()), ", ", f.threads_description());
  if (const std::string out = c.get_string("generate.output"); !out.empty() && f.is_global_zero()) {
    const nlohmann::json json = {{"prompt_ids", prompt_ids},
                                 {"ids", ids},
                                 {"text", text},
                                 {"prefill_seconds", prefill_s},
                                 {"decode_seconds", decode_s},
                                 {"decode_tokens_per_second", decode_rate}};
    std::ofstream file(out);
    file << json.dump(1) << "\n";
    if (!file.flush()) throw c.error_at("generate.output", "cannot write " + out);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return fabric::run_main(argc, argv, schema(), [](const fabric::Config& config) {
    if (config.get_string("model.pretrained").empty())
      throw config.error_at("model.pretrained",
                            "not set; give a Hugging Face model folder: model.pretrained=DIR");
    examples::refuse_pipeline_and_context_parallel(config, "examples:generate");
    fabric::Fabric fabric(config);
    return fabric.launch(run);
  });
}
