// examples:gpt and examples:generate with model.pretrained, against Hugging Face transformers:
// small random Llama (GQA, llama3 rope, untied), Qwen2 (biases, tied) and GPT-2 folders with
// tokenizers trained by `tokenizers` (pretrained_models.py make) are
//   - generated from: greedy float32 ids, prompt ids and text equal transformers' and tokenizers'
//     (Llama and GPT-2 with a peft adapter merged too: model.adapter, against peft; the
//     key/value cache under tp 2 (Llama, GPT-2) and fsdp 2 (Qwen2) too);
//   - loaded under one process, fsdp over 2 (empty init), tp 2 (with sequence parallelism too),
//     pp 2 (Qwen2) and cp 2 (Llama): the validation loss before any step equals transformers' on
//     the same windows (so every rank's slices, stages and chunks were right);
//   - trained 2 steps and exported (checkpoint.export_format=hf) from fsdp, tp, pp, cp and ddp
//     (sharded files), and a GPT trained from scratch as GPT-2: transformers loads each folder and
//     its validation loss equals the run's own;
// and bad input (an adapter made for another base, a missing folder, a Fabric++ checkpoint, size
// keys beside model.pretrained, a window longer than the model's positions, data whose vocabulary
// does not fit, a truncated safetensors file) stops with one line naming the key or file.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run_command.h"

namespace fs = std::filesystem;
using fabric::testing::run_command;

namespace {

class PretrainedExampleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "pretrained_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    // Text for the tokenizers and the token files: this repository's README, three times.
    std::ifstream readme("README.md");
    const std::string text(std::istreambuf_iterator<char>(readme), {});
    std::ofstream(dir_ / "text.txt") << text << text << text;
    const auto made = run_command(python() + " tests/integration/pretrained_models.py make " +
                                  dir_.string() + " " + (dir_ / "text.txt").string());
    ASSERT_EQ(made.code, 0) << made.out;
    for (const char* m : {"llama", "qwen2", "gpt2"}) {
      const auto r =
          run_command("tools/prepare_text --tokenizer=" + (dir_ / m / "tokenizer.json").string() +
                      " --input=" + (dir_ / "text.txt").string() +
                      " --output=" + (dir_ / (std::string("tok_") + m)).string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string python() {
    const char* p = std::getenv("PYTHON");
    return p ? p : "python3";
  }

  // examples/<binary> with `args`, run from the suite's folder.
  static fabric::testing::CommandResult run(const std::string& binary, const std::string& args) {
    return run_command("cd '" + dir_.string() + "' && '" +
                       (fs::current_path() / "examples" / binary).string() + "' " + args);
  }

  // examples/gpt on model `m`'s folder and tokens: `steps` steps of 4 windows of 64 per rank,
  // float32, 2 validation batches; returns summary.json's path.
  static std::string train(const std::string& m, int steps, const std::string& extra) {
    const auto r = run("gpt", "model.pretrained=" + (dir_ / m).string() +
                                  " data.root=" + (dir_ / ("tok_" + m)).string() +
                                  " trainer.max_steps=" + std::to_string(steps) +
                                  " data.batch_size=4 model.block_size=64 fabric.precision=32-true"
                                  " trainer.limit_eval_batches=2 gpt.sample_tokens=0 " +
                                  extra);
    EXPECT_EQ(r.code, 0) << r.out;
    const size_t at = r.out.rfind("summary.json");
    if (r.code != 0 || at == std::string::npos) return "";
    const size_t begin = r.out.rfind('\n', at) + 1;
    return r.out.substr(begin, at + 12 - begin);
  }

  static fs::path dir_;
};

fs::path PretrainedExampleTest::dir_;

const char kFsdp[] =
    "fabric.devices=2 fabric.strategy=fsdp fabric.fsdp.wrap_modules=LlamaDecoderLayer "
    "fabric.empty_init=true";
// Pipeline parallelism (2 stages of the 2 layers, 4 micro-batches) and context parallelism (each
// rank 2 of the 4 chunks of every window): one data-parallel rank, 8 windows.
const char kPp[] =
    "fabric.devices=2 fabric.strategy=model_parallel "
    "fabric.model_parallel.pipeline_parallel_size=2 fabric.pipeline.micro_batches=4";
const char kCp[] =
    "fabric.devices=2 fabric.strategy=model_parallel fabric.model_parallel.context_parallel_size=2";
const char kTp[] =
    "fabric.devices=2 fabric.strategy=model_parallel fabric.model_parallel.tensor_parallel_size=2 "
    "fabric.empty_init=true";

TEST_F(PretrainedExampleTest, MatchesTransformers) {
  std::ofstream checks(dir_ / "checks.jsonl");
  auto check = [&](const nlohmann::json& c) { checks << c.dump() << "\n"; };
  const std::string prompt = "Fabric++ trains";
  for (const char* m : {"llama", "qwen2", "gpt2"}) {
    const fs::path out = dir_ / (std::string(m) + ".gen.json");
    const auto r =
        run("generate", "model.pretrained=" + (dir_ / m).string() + " generate.prompt='" + prompt +
                            "' generate.max_new_tokens=24 generate.temperature=0"
                            " fabric.precision=32-true generate.output=" +
                            out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("tokens/s"), std::string::npos) << r.out;
    check({"generate", (dir_ / m).string(), out.string(), prompt});
  }
  // The key/value cache under tensor parallelism (each rank caches its heads; GQA's llama and
  // GPT-2's fused c_attn) and fsdp (each operator gathers the units it reads): transformers' ids.
  for (const auto& [m, strategy] :
       {std::pair<std::string, std::string>{"llama", kTp}, {"gpt2", kTp}, {"qwen2", kFsdp}}) {
    const fs::path out = dir_ / (m + ".parallel.gen.json");
    const auto r =
        run("generate", "model.pretrained=" + (dir_ / m).string() + " generate.prompt='" + prompt +
                            "' generate.max_new_tokens=24 generate.temperature=0"
                            " fabric.precision=32-true " +
                            strategy + " generate.output=" + out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("tokens/s (key/value cache)"), std::string::npos) << r.out;
    check({"generate", (dir_ / m).string(), out.string(), prompt});
  }
  // With a peft adapter (model.adapter, merged before setup) against peft's merge_and_unload.
  for (const char* m : {"llama", "gpt2"}) {
    const fs::path out = dir_ / (std::string(m) + ".adapter.gen.json");
    const fs::path adapter = dir_ / (std::string(m) + "_adapter");
    const auto r = run("generate", "model.pretrained=" + (dir_ / m).string() + " model.adapter=" +
                                       adapter.string() + " generate.prompt='" + prompt +
                                       "' generate.max_new_tokens=24 generate.temperature=0"
                                       " fabric.precision=32-true generate.output=" +
                                       out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("LoRA rank 4 on"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("note:"), std::string::npos) << r.out;  // its own base
    check({"generate", (dir_ / m).string(), out.string(), prompt, adapter.string()});
  }
  // Loaded weights: the validation loss before any step (windows: 8 per rank).
  const std::string window = "64";
  check({"val_loss", (dir_ / "qwen2").string(), (dir_ / "tok_qwen2").string(), window, 8,
         train("qwen2", 0, "")});
  check({"val_loss", (dir_ / "llama").string(), (dir_ / "tok_llama").string(), window, 16,
         train("llama", 0, kFsdp)});
  check({"val_loss", (dir_ / "gpt2").string(), (dir_ / "tok_gpt2").string(), window, 8,
         train("gpt2", 0, kTp)});
  check({"val_loss", (dir_ / "llama").string(), (dir_ / "tok_llama").string(), window, 8,
         train("llama", 0, std::string(kTp) + " fabric.model_parallel.sequence_parallel=true")});
  check({"val_loss", (dir_ / "qwen2").string(), (dir_ / "tok_qwen2").string(), window, 8,
         train("qwen2", 0, kPp)});
  check({"val_loss", (dir_ / "llama").string(), (dir_ / "tok_llama").string(), window, 8,
         train("llama", 0, kCp)});
  // Exports after 2 steps, from fsdp, tp and ddp (in shards of at most 50 KB).
  auto exported = [&](const std::string& m, const std::string& strategy, int windows,
                      const std::string& as = "") {
    const fs::path out = dir_ / ("export_" + m + as);
    const std::string summary = train(
        m, 2, strategy + " checkpoint.export_format=hf checkpoint.export_weights=" + out.string());
    EXPECT_TRUE(fs::exists(out / "tokenizer.json")) << "the tokenizer is copied beside";
    check({"val_loss", out.string(), (dir_ / ("tok_" + m)).string(), window, windows, summary});
  };
  exported("llama", kFsdp, 16);
  exported("gpt2", kTp, 8);
  exported("qwen2", "fabric.devices=2 fabric.strategy=ddp checkpoint.export_shard_gb=0.00005", 16);
  exported("llama", kPp, 8, "_pp");
  exported("qwen2", kCp, 8, "_cp");
  EXPECT_TRUE(fs::exists(dir_ / "export_qwen2" / "model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir_ / "export_qwen2" / "model-00002-of-00006.safetensors"));
  // A GPT trained from scratch (no model.pretrained) exported as GPT-2.
  {
    const fs::path out = dir_ / "export_scratch";
    const auto r = run("gpt", "data.root=" + (dir_ / "tok_gpt2").string() +
                                  " model.n_layer=2 model.n_head=2 model.n_embd=32 "
                                  "model.block_size=64 trainer.max_steps=2 data.batch_size=4 "
                                  "trainer.limit_eval_batches=2 gpt.sample_tokens=0 "
                                  "fabric.precision=32-true checkpoint.export_format=hf "
                                  "checkpoint.export_weights=" +
                                  out.string());
    ASSERT_EQ(r.code, 0) << r.out;
    const size_t at = r.out.rfind("summary.json");
    const size_t begin = r.out.rfind('\n', at) + 1;
    check({"val_loss", out.string(), (dir_ / "tok_gpt2").string(), window, 8,
           r.out.substr(begin, at + 12 - begin)});
  }
  checks.close();
  const auto r = run_command(python() + " tests/integration/pretrained_models.py checks " +
                             (dir_ / "checks.jsonl").string());
  EXPECT_EQ(r.code, 0) << r.out;
  size_t ok = 0;
  for (size_t at = r.out.find("\nok "); at != std::string::npos; at = r.out.find("\nok ", at + 1))
    ++ok;
  if (r.out.rfind("ok ", 0) == 0) ++ok;
  EXPECT_EQ(ok, 20u) << r.out;
}

TEST_F(PretrainedExampleTest, BadInputIsOneLine) {
  auto expect_error = [&](const std::string& binary, const std::string& args,
                          const std::vector<std::string>& words) {
    const auto r = run(binary, args);
    EXPECT_NE(r.code, 0) << args << "\n" << r.out;
    std::string out = r.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    const std::string line = out.substr(out.rfind('\n') + 1);  // the last line says it all
    for (const auto& w : words) EXPECT_NE(line.find(w), std::string::npos) << w << " in " << line;
  };
  const std::string llama = "model.pretrained=" + (dir_ / "llama").string();
  const std::string data = " data.root=" + (dir_ / "tok_llama").string() + " trainer.max_steps=1";
  expect_error("gpt", "model.pretrained=" + (dir_ / "nowhere").string() + data,
               {"model.pretrained", "nowhere", "no such folder"});
  std::ofstream(dir_ / "step-1.ckpt") << "not a folder";
  expect_error("gpt", "model.pretrained=" + (dir_ / "step-1.ckpt").string() + data,
               {"model.pretrained", "Fabric++ checkpoint", "checkpoint.resume"});
  fs::create_directories(dir_ / "sharded");
  std::ofstream(dir_ / "sharded" / "manifest.json") << "{}";
  expect_error("gpt", "model.pretrained=" + (dir_ / "sharded").string() + data,
               {"Fabric++ checkpoint", "model.init_weights"});
  expect_error("gpt", llama + data + " model.n_layer=4", {"model.n_layer", "model.pretrained"});
  expect_error("gpt", llama + data + " model.block_size=4096",
               {"model.block_size", "128 positions", "config.json"});
  // Token data whose meta.json claims more ids than the model has.
  fs::copy(dir_ / "tok_llama", dir_ / "tok_big");
  {
    std::ifstream in(dir_ / "tok_big" / "meta.json");
    nlohmann::json meta = nlohmann::json::parse(in);
    meta["vocab_size"] = 5000;
    std::ofstream(dir_ / "tok_big" / "meta.json") << meta.dump();
  }
  expect_error("gpt", llama + " data.root=" + (dir_ / "tok_big").string(),
               {"model.pretrained", "5000", "does not fit", "prepare_text --tokenizer="});
  // An adapter made for another base: layers it does not have, or (shapes that fit) a note.
  expect_error("generate",
               llama + " model.adapter=" + (dir_ / "gpt2_adapter").string() + " generate.prompt=a",
               {"model.adapter", "made for another base model", "'" + (dir_ / "gpt2").string(),
                "matches no fabric::nn::Linear layer", "give the base it was trained on"});
  const auto fits = run("generate", "model.pretrained=" + (dir_ / "qwen2").string() +
                                        " model.adapter=" + (dir_ / "llama_adapter").string() +
                                        " generate.prompt=a generate.max_new_tokens=2");
  EXPECT_EQ(fits.code, 0) << fits.out;
  EXPECT_NE(fits.out.find("note: adapter_config.json's base_model_name_or_path is '" +
                          (dir_ / "llama").string() + "', model.pretrained is " +
                          (dir_ / "qwen2").string() + " (the shapes fit)"),
            std::string::npos)
      << fits.out;
  // A safetensors file cut short.
  fs::copy(dir_ / "qwen2", dir_ / "cut");
  fs::resize_file(dir_ / "cut" / "model.safetensors",
                  fs::file_size(dir_ / "cut" / "model.safetensors") / 2);
  expect_error("generate", "model.pretrained=" + (dir_ / "cut").string() + " generate.prompt=a",
               {"model.safetensors"});
  // A config.json of 100000000 layers over weights of 2: refused before any layer is built.
  fs::copy(dir_ / "qwen2", dir_ / "deep");
  {
    std::ifstream in(dir_ / "deep" / "config.json");
    nlohmann::json config = nlohmann::json::parse(in);
    config["num_hidden_layers"] = 100000000;
    std::ofstream(dir_ / "deep" / "config.json") << config.dump();
  }
  expect_error("generate", "model.pretrained=" + (dir_ / "deep").string() + " generate.prompt=a",
               {"model.pretrained",
                "config.json: num_hidden_layers 100000000, but the weights "
                "hold 2 layers (model.safetensors)"});
  // A chat format the folder does not have, a system message without one.
  expect_error("generate", llama + " generate.prompt=a generate.template=chat_template",
               {"generate.template: " + (dir_ / "llama").string() + " has no chat template",
                "a FILE.jinja"});
  expect_error("generate", llama + " generate.prompt=a generate.template=chatml",
               {"generate.template", "is none, chat_template or a FILE.jinja"});
  expect_error("generate", llama + " generate.prompt=a generate.system=brief",
               {"generate.system", "generate.template is none"});
  std::ofstream(dir_ / "empty.jinja") << "";
  expect_error("generate",
               llama + " generate.prompt=a generate.template=" + (dir_ / "empty.jinja").string(),
               {"generate.template", "renders nothing for a user message"});
  // A prompt that fills the positions names the prompt, not max_new_tokens.
  std::string numbers;
  for (int i = 0; i < 200; ++i) numbers += std::to_string(i) + " ";
  expect_error("generate", llama + " generate.prompt='" + numbers + "'",
               {"generate.prompt", "fill the model's 128 positions", "give a shorter prompt"});
  // generate.output never replaces an input or a file it did not write, checked before decoding.
  const fs::path weights = dir_ / "qwen2" / "model.safetensors";
  const auto size = fs::file_size(weights);
  const std::string qwen2 = "model.pretrained=" + (dir_ / "qwen2").string() + " generate.prompt=a";
  expect_error("generate", qwen2 + " generate.output=" + weights.string(),
               {"generate.output", "model.pretrained"});
  EXPECT_EQ(fs::file_size(weights), size);
  std::ofstream(dir_ / "notes.json") << "{\"mine\": 1}";
  expect_error("generate", qwen2 + " generate.output=" + (dir_ / "notes.json").string(),
               {"generate.output", "not an earlier output of generate", "give a new file name"});
  EXPECT_EQ(fs::file_size(dir_ / "notes.json"), 11u);
  // An empty file (mktemp's) is written, then the earlier output it holds is replaced.
  std::ofstream(dir_ / "out.json").close();
  const std::string out =
      " generate.max_new_tokens=2 generate.output=" + (dir_ / "out.json").string();
  for (int i = 0; i < 2; ++i) {
    const auto r = run("generate", qwen2 + out);
    ASSERT_EQ(r.code, 0) << r.out;
  }
}

}  // namespace
