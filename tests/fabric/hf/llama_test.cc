// fabric::hf::load_llama against Hugging Face transformers: tiny random models built and saved by
// make_llamas.py (transformers, fixed seeds) load here and give transformers' logits, loss and
// gradients to 1e-5 (relative to the largest value); broken folders give one-line errors naming
// the file and the tensor or key. Greedy generation with the key/value cache
// (fabric/models/llama_generate.h) gives transformers' generate(do_sample=False) ids, for one
// prompt and for a left-padded batch of prompts of different lengths.
#include "fabric/hf/llama.h"
#include "fabric/hf/pretrained.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/error.h"
#include "fabric/models/generate.h"
#include "fabric/models/llama_generate.h"
#include "tests/fabric/hf/generation_testing.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

using fabric::testing::batch_prompts;
using fabric::testing::row;

class LlamaHfTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / "hf_llamas";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* python = std::getenv("PYTHON");
    const auto r = fabric::testing::run_command(std::string(python ? python : "python3") +
                                                " tests/fabric/hf/make_llamas.py " + dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::map<std::string, torch::Tensor> reference(const std::string& name) {
    return fabric::testing::tensors_of(dir_ / (name + ".ref.safetensors"));
  }

  // NAME.gen.safetensors: transformers' greedy generations.
  static std::map<std::string, torch::Tensor> generation_reference(const std::string& name) {
    return fabric::testing::tensors_of(dir_ / (name + ".gen.safetensors"));
  }

  // max |a - b| / max |b|.
  static double relative(const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  }

  // Logits, loss and every gradient of `name`'s folder against transformers'.
  static void check_against_transformers(const std::string& name) {
    SCOPED_TRACE(name);
    fabric::models::Llama model = fabric::hf::load_llama(dir_ / name);
    for (const auto& p : model->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat);
    auto ref = reference(name);
    const torch::Tensor ids = ref.at("ids");
    torch::Tensor logits;
    {
      torch::NoGradGuard no_grad;
      logits = model->forward(ids);
    }
    ASSERT_EQ(logits.sizes(), ref.at("logits").sizes());
    const double d = relative(logits, ref.at("logits"));
    std::cout << name << ": logits max difference " << d << " (relative)\n";
    EXPECT_LT(d, 1e-5);

    const int64_t T = ids.size(1);
    const torch::Tensor loss = model->loss(ids.narrow(1, 0, T - 1), ids.narrow(1, 1, T - 1));
    loss.backward();
    const double dl = relative(loss.reshape({1}), ref.at("loss"));
    EXPECT_LT(dl, 1e-5);
    double worst = 0;
    int compared = 0;
    for (const auto& item : model->named_parameters()) {
      const auto it = ref.find("grad." + item.key());
      ASSERT_NE(it, ref.end()) << "transformers has no parameter " << item.key();
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      const double dg = relative(item.value().grad(), it->second);
      EXPECT_LT(dg, 1e-5) << item.key();
      worst = std::max(worst, dg);
      ++compared;
    }
    EXPECT_EQ(compared + 3, static_cast<int>(ref.size()));  // every gradient, ids, logits, loss
    std::cout << name << ": loss difference " << dl << ", worst of " << compared << " gradients "
              << worst << " (relative)\n";
  }

  // A copy of folder `name` as `copy`, config.json edited by `edit`.
  static fs::path copy(const std::string& name, const std::string& copy,
                       const std::function<void(nlohmann::json&)>& edit = nullptr) {
    const fs::path to = dir_ / copy;
    fs::remove_all(to);
    fs::copy(dir_ / name, to, fs::copy_options::recursive);
    if (edit) {
      nlohmann::json json;
      std::ifstream(to / "config.json") >> json;
      edit(json);
      std::ofstream(to / "config.json") << json.dump(2);
    }
    return to;
  }

  // The message of the fabric::Error load_llama throws for `folder` ("" if none).
  static std::string load_error(const fs::path& folder) {
    try {
      fabric::hf::load_llama(folder);
    } catch (const fabric::Error& e) {
      std::cout << "error: " << e.what() << "\n";
      return e.what();
    }
    return "";
  }

  static fs::path dir_;
};

fs::path LlamaHfTest::dir_;

TEST_F(LlamaHfTest, ReadsTheConfigsTransformersWrote) {
  const auto llama = fabric::hf::read_llama_config(dir_ / "llama");
  EXPECT_EQ(llama.model_type, "llama");
  EXPECT_EQ(llama.num_key_value_heads, 2);
  EXPECT_EQ(llama.resolved_head_dim(), 16);
  EXPECT_EQ(llama.rope_type, "llama3");  // from transformers 5's rope_parameters
  EXPECT_EQ(llama.rope_original_max_position_embeddings, 16);
  EXPECT_DOUBLE_EQ(llama.rope_theta, 500000.0);
  EXPECT_FALSE(llama.tie_word_embeddings);
  const auto qwen = fabric::hf::read_llama_config(dir_ / "qwen2" / "config.json");
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_FALSE(qwen.attention_bias);
  EXPECT_TRUE(qwen.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(qwen.rope_theta, 1000.0);
  EXPECT_EQ(fabric::hf::read_llama_config(dir_ / "qwen2_bf16").torch_dtype, "bfloat16");
}

TEST_F(LlamaHfTest, ShardedLlamaWithGqaAndLlama3RopeMatchesTransformers) {
  ASSERT_TRUE(fs::exists(dir_ / "llama" / "model.safetensors.index.json"));
  check_against_transformers("llama");
}

TEST_F(LlamaHfTest, Qwen2WithBiasesAndTiedEmbeddingsMatchesTransformers) {
  check_against_transformers("qwen2");
  fabric::models::Llama model = fabric::hf::load_llama(dir_ / "qwen2");
  EXPECT_FALSE(model->lm_head);
  EXPECT_EQ(model->output_weight().data_ptr(), model->embed_tokens->weight.data_ptr());
}

TEST_F(LlamaHfTest, Bfloat16WeightsLoadIntoFloat32Parameters) {
  check_against_transformers("qwen2_bf16");
}

TEST_F(LlamaHfTest, RopeScalingOfTransformers4IsReadToo) {
  const fs::path folder = copy("llama", "llama_v4", [](nlohmann::json& j) {
    j["rope_scaling"] = j["rope_parameters"];
    j["rope_theta"] = j["rope_parameters"]["rope_theta"];
    j["rope_scaling"].erase("rope_theta");
    j.erase("rope_parameters");
  });
  const auto c = fabric::hf::read_llama_config(folder);
  EXPECT_EQ(c.rope_type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c.rope_factor, 8.0);
}

TEST_F(LlamaHfTest, BrokenFoldersAreOneLineErrorsNamingTheFileAndTensor) {
  const fs::path no_shard = copy("llama", "no_shard");
  fs::remove(no_shard / "model-00003-of-00012.safetensors");
  std::string e = load_error(no_shard);
  EXPECT_NE(e.find("model.safetensors.index.json: shard model-00003-of-00012.safetensors"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("is missing"), std::string::npos) << e;

  e = load_error(copy("llama", "wide", [](nlohmann::json& j) { j["intermediate_size"] = 128; }));
  // The index lists down_proj first (its weight_map is sorted), so its shard is read first.
  EXPECT_NE(e.find("-of-00012.safetensors: tensor model.layers.0.mlp.down_proj.weight is [64, 96], "
                   "but "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("config.json makes it [64, 128]"), std::string::npos) << e;

  e = load_error(
      copy("qwen2", "untied", [](nlohmann::json& j) { j["tie_word_embeddings"] = false; }));
  EXPECT_NE(e.find("tensor lm_head.weight [96, 64] is missing from the weights"), std::string::npos)
      << e;

  // config.json's layer count and embedding are checked against the weights before the model is
  // built: 100000000 layers or a 2^40-id vocabulary is an error at once, not minutes of building.
  e = load_error(copy("qwen2", "shallow", [](nlohmann::json& j) { j["num_hidden_layers"] = 1; }));
  EXPECT_NE(e.find("config.json: num_hidden_layers 1, but the weights hold 2 layers "
                   "(model.safetensors); config.json and the weights must describe the same "
                   "model"),
            std::string::npos)
      << e;
  e = load_error(
      copy("qwen2", "huge", [](nlohmann::json& j) { j["num_hidden_layers"] = 100000000; }));
  EXPECT_NE(e.find("config.json: num_hidden_layers 100000000, but the weights hold 2 layers"),
            std::string::npos)
      << e;
  e = load_error(
      copy("qwen2", "vocab", [](nlohmann::json& j) { j["vocab_size"] = int64_t{1} << 40; }));
  EXPECT_NE(e.find("config.json: vocab_size 1099511627776 and hidden_size 64 make the token "
                   "embedding [1099511627776, 64], but model.embed_tokens.weight is [96, 64] in "
                   "model.safetensors"),
            std::string::npos)
      << e;

  // Weights under other names (a base model saved without its head: layers.0..., no model.):
  // no layer count to compare; the file and the expected names are said.
  {
    const fs::path headless = copy("qwen2", "headless");
    std::vector<std::pair<std::string, at::Tensor>> renamed;
    for (const auto& [name, tensor] : fabric::hf::read_weights(headless).tensors)
      renamed.emplace_back(name.rfind("model.", 0) == 0 ? name.substr(6) : name, tensor.clone());
    fabric::save_safetensors(headless / "model.safetensors", renamed);
  }
  e = load_error(dir_ / "headless");
  EXPECT_NE(e.find("model.safetensors: no tensor is named model.layers.N.* (the first is "),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("not the weights of the causal language model config.json describes"),
            std::string::npos)
      << e;

  // A config.json cut short and an index that is an array: where the JSON ends, which type.
  {
    const fs::path cut = copy("qwen2", "cut");
    std::ifstream in(cut / "config.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(cut / "config.json") << text.substr(0, text.rfind(',', text.size() / 2) + 1);
    const fs::path array = copy("llama", "array");
    std::ofstream(array / "model.safetensors.index.json") << "[]";
  }
  e = load_error(dir_ / "cut");
  EXPECT_NE(e.find("config.json: not JSON (line "), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected end of input"), std::string::npos) << e;
  e = load_error(dir_ / "array");
  EXPECT_NE(e.find("model.safetensors.index.json: a JSON array, not an object; save the model "
                   "again"),
            std::string::npos)
      << e;

  for (const auto& n :
       {"no_shard", "wide", "untied", "shallow", "huge", "vocab", "headless", "cut", "array"})
    EXPECT_EQ(std::string(load_error(dir_ / n)).find('\n'), std::string::npos);
  EXPECT_NE(load_error(dir_ / "absent").find("absent: no such folder"), std::string::npos);
}

TEST_F(LlamaHfTest, UnsupportedConfigsNameConfigJsonAndTheKey) {
  auto config_error = [](const fs::path& folder) -> std::string {
    try {
      fabric::hf::read_llama_config(folder);
    } catch (const fabric::Error& e) {
      std::cout << "error: " << e.what() << "\n";
      return e.what();
    }
    return "";
  };
  std::string e =
      config_error(copy("llama", "gpt2", [](nlohmann::json& j) { j["model_type"] = "gpt2"; }));
  EXPECT_NE(e.find("config.json: model_type: 'gpt2' is not a Llama-family model"),
            std::string::npos)
      << e;
  e = config_error(
      copy("llama", "yarn", [](nlohmann::json& j) { j["rope_parameters"]["rope_type"] = "yarn"; }));
  EXPECT_NE(e.find("config.json: rope_parameters.rope_type: 'yarn' is not supported"),
            std::string::npos)
      << e;
  e = config_error(copy("llama", "gelu", [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }));
  EXPECT_NE(e.find("config.json: hidden_act: 'gelu' is not supported"), std::string::npos) << e;
  e = config_error(copy("llama", "kv3", [](nlohmann::json& j) { j["num_key_value_heads"] = 3; }));
  EXPECT_NE(e.find("config.json: LlamaConfig.num_key_value_heads: 3 does not divide"),
            std::string::npos)
      << e;
  e = config_error(copy("llama", "no_vocab", [](nlohmann::json& j) { j.erase("vocab_size"); }));
  EXPECT_NE(e.find("config.json: vocab_size: missing"), std::string::npos) << e;

  // Qwen2's window applies to the layers layer_types marks (from max_window_layers on).
  EXPECT_EQ(fabric::hf::read_llama_config(copy("qwen2", "qwen2_full",
                                               [](nlohmann::json& j) {
                                                 j["use_sliding_window"] = true;
                                                 j["sliding_window"] = 8;
                                               }))
                .sliding_window,
            0);
  EXPECT_EQ(fabric::hf::read_llama_config(copy("qwen2", "qwen2_window",
                                               [](nlohmann::json& j) {
                                                 j["use_sliding_window"] = true;
                                                 j["sliding_window"] = 8;
                                                 j["layer_types"][1] = "sliding_attention";
                                               }))
                .sliding_window,
            8);
  // A window switched on without its key: transformers' default, 4096 (it was none: full
  // attention over longer sequences, silently); null: none.
  EXPECT_EQ(fabric::hf::read_llama_config(copy("qwen2", "qwen2_default",
                                               [](nlohmann::json& j) {
                                                 j.erase("sliding_window");
                                                 j["use_sliding_window"] = true;
                                                 j["layer_types"][1] = "sliding_attention";
                                               }))
                .sliding_window,
            4096);
  EXPECT_EQ(fabric::hf::read_llama_config(copy("llama", "mistral_default",
                                               [](nlohmann::json& j) {
                                                 j.erase("sliding_window");
                                                 j["model_type"] = "mistral";
                                               }))
                .sliding_window,
            4096);
  EXPECT_EQ(fabric::hf::read_llama_config(copy("llama", "mistral_null",
                                               [](nlohmann::json& j) {
                                                 j["model_type"] = "mistral";
                                                 j["sliding_window"] = nullptr;
                                               }))
                .sliding_window,
            0);
  e = config_error(copy("qwen2", "qwen2_chunked",
                        [](nlohmann::json& j) { j["layer_types"][1] = "chunked_attention"; }));
  EXPECT_NE(e.find("config.json: layer_types: \"chunked_attention\" is not supported"),
            std::string::npos)
      << e;

  // A sliding window that a sequence exceeds is refused where it would matter.
  const fs::path mistral = copy("llama", "mistral", [](nlohmann::json& j) {
    j["model_type"] = "mistral";
    j["sliding_window"] = 8;
  });
  fabric::models::Llama model = fabric::hf::load_llama(mistral);
  const torch::Tensor ids = reference("llama").at("ids");
  EXPECT_NO_THROW(model->forward(ids.narrow(1, 0, 8)));
  try {
    model->forward(ids);
    ADD_FAILURE() << "a sequence longer than the sliding window ran";
  } catch (const fabric::Error& err) {
    std::cout << "error: " << err.what() << "\n";
    EXPECT_NE(std::string(err.what()).find("config.json's sliding_window 8"), std::string::npos);
  }
}

// Greedy ids with the key/value cache against transformers' generate(do_sample=False,
// max_new_tokens=32) in float32: one prompt, and a batch of 3 prompts of lengths 5, 9, 3
// (transformers: left padding and attention_mask; here: the same, one batch).
TEST_F(LlamaHfTest, GreedyGenerationWithKvCacheMatchesTransformers) {
  for (const std::string name : {"llama", "qwen2"}) {
    SCOPED_TRACE(name);
    fabric::models::Llama model = fabric::hf::load_llama(dir_ / name);
    const auto gen = generation_reference(name);
    fabric::models::GenerateOptions o;
    o.max_new_tokens = 32;
    auto single = fabric::models::generate(*model, {row(gen.at("single.prompt"))}, o);
    EXPECT_TRUE(torch::equal(single.ids, gen.at("single.new")))
        << "got " << single.ids << "\ntransformers " << gen.at("single.new");
    auto batch = fabric::models::generate(*model, batch_prompts(gen), o);
    EXPECT_TRUE(torch::equal(batch.ids, gen.at("batch.new")))
        << "got " << batch.ids << "\ntransformers " << gen.at("batch.new");
    EXPECT_EQ(batch.steps, 32);
    for (const auto& t : batch.tokens) EXPECT_EQ(t.size(), 32u);
    std::cout << name << ": decode " << batch.decode_tokens_per_second << " tokens/s (batch of 3, "
              << batch.steps - 1 << " steps, CPU), " << single.decode_tokens_per_second
              << " tokens/s (one row); prefill " << batch.prefill_seconds * 1e3 << " ms\n";
  }
}

// The cache changes nothing: greedy ids with it equal argmax of a full forward over the whole
// sequence at each step.
TEST_F(LlamaHfTest, KvCacheGreedyEqualsGreedyWithoutCache) {
  for (const std::string name : {"llama", "qwen2"}) {
    SCOPED_TRACE(name);
    fabric::models::Llama model = fabric::hf::load_llama(dir_ / name);
    const auto gen = generation_reference(name);
    fabric::models::GenerateOptions o;
    o.max_new_tokens = 24;
    auto prompts = batch_prompts(gen);
    prompts.push_back(row(gen.at("single.prompt")));
    for (const auto& prompt : prompts) {
      const auto cached = fabric::models::generate(*model, {prompt}, o);
      EXPECT_EQ(cached.tokens[0],
                fabric::testing::greedy_without_cache(model, prompt, o.max_new_tokens));
    }
  }
}

TEST_F(LlamaHfTest, TopK1AndTinyTopPSamplingEqualGreedy) {
  fabric::models::Llama model = fabric::hf::load_llama(dir_ / "llama");
  const auto gen = generation_reference("llama");
  fabric::models::GenerateOptions o;
  o.max_new_tokens = 32;
  o.temperature = 1.5;
  o.top_k = 1;
  o.seed = 11;
  EXPECT_TRUE(torch::equal(fabric::models::generate(*model, batch_prompts(gen), o).ids,
                           gen.at("batch.new")));
  o.top_k = 0;
  o.top_p = 1e-6;
  EXPECT_TRUE(torch::equal(fabric::models::generate(*model, batch_prompts(gen), o).ids,
                           gen.at("batch.new")));
  // A temperature too small for a float (1 / 1e-300 overflows) samples the greedy ids too.
  o.top_p = 1;
  o.temperature = 1e-300;
  EXPECT_TRUE(torch::equal(fabric::models::generate(*model, batch_prompts(gen), o).ids,
                           gen.at("batch.new")));
  o.temperature = 1.5;
  // Real sampling: the same seed gives the same ids, and they are not the greedy ones.
  o.top_p = 0.9;
  o.top_k = 20;
  const torch::Tensor a = fabric::models::generate(*model, batch_prompts(gen), o).ids;
  EXPECT_TRUE(torch::equal(a, fabric::models::generate(*model, batch_prompts(gen), o).ids));
  EXPECT_FALSE(torch::equal(a, gen.at("batch.new")));
  EXPECT_TRUE(a.ge(0).all().item<bool>() && a.lt(96).all().item<bool>());

  // Sampling options that are not numbers to sample by: one line, from generate and from the
  // public choose_next_tokens alike (a NaN temperature reached multinomial's error with
  // LibTorch's stack; a negative one sampled the least likely tokens there).
  const auto error_of = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const fabric::Error& e) {
      return e.what();
    }
    return "no error";
  };
  fabric::models::GenerateOptions bad;
  bad.temperature = std::nan("");
  EXPECT_NE(error_of([&] {
              fabric::models::generate(*model, batch_prompts(gen), bad);
            }).find("generate: temperature nan must be 0 (greedy) or a finite positive number"),
            std::string::npos);
  at::Generator cpu = at::detail::createCPUGenerator(1);
  const torch::Tensor logits = torch::randn({2, 96});
  bad.temperature = -1;
  EXPECT_NE(error_of([&] {
              fabric::models::choose_next_tokens(logits, bad, cpu);
            }).find("choose_next_tokens: temperature -1.000000 must be 0"),
            std::string::npos);
  bad.temperature = 1;
  bad.top_p = 0;
  EXPECT_NE(error_of([&] {
              fabric::models::choose_next_tokens(logits, bad, cpu);
            }).find("choose_next_tokens: top_p 0.000000 must be in (0, 1]"),
            std::string::npos);
}

// Llama 3's tokenizer puts <|begin_of_text|> first through tokenizer.json's post-processor (a
// TemplateProcessing in a Sequence), its tokenizer_config.json without add_bos_token: the folder
// adds bos as `tokenizers` encodes (it added none: prompts differed from transformers'). An
// add_bos_token the config states wins.
TEST_F(LlamaHfTest, ATemplatePostProcessorPutsBosFirstAsTokenizersDoes) {
  const fs::path folder = copy("llama", "llama3_template");
  fs::remove(folder / "tokenizer_config.json");
  std::ofstream(dir_ / "template.py")
      << "import sys\n"
         "from tokenizers import Tokenizer, models, pre_tokenizers, processors\n"
         "tok = Tokenizer(models.BPE(vocab={'h': 0, 'i': 1, '<|begin_of_text|>': 2}, merges=[]))\n"
         "tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)\n"
         "tok.add_special_tokens(['<|begin_of_text|>'])\n"
         "tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False),\n"
         "    processors.TemplateProcessing(single='<|begin_of_text|> $A',\n"
         "        special_tokens=[('<|begin_of_text|>', 2)])])\n"
         "tok.save(sys.argv[1] + '/tokenizer.json')\n"
         "print('first', tok.encode('hi').ids[0])\n";
  const auto r =
      fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                   (dir_ / "template.py").string() + " " + folder.string());
  ASSERT_EQ(r.code, 0) << r.out;
  ASSERT_NE(r.out.find("first 2"), std::string::npos) << r.out;
  const fabric::hf::Pretrained p = fabric::hf::read_pretrained(folder);
  EXPECT_TRUE(p.add_bos_token);
  EXPECT_EQ(p.bos_token_id, 2);
  std::ofstream(folder / "tokenizer_config.json") << R"({"add_bos_token": false})";
  EXPECT_FALSE(fabric::hf::read_pretrained(folder).add_bos_token);
}

TEST_F(LlamaHfTest, EosStopsARowAndPadsAfterIt) {
  fabric::models::Llama model = fabric::hf::load_llama(dir_ / "llama");
  const auto gen = generation_reference("llama");
  const torch::Tensor greedy = gen.at("batch.new");
  fabric::models::GenerateOptions o;
  o.max_new_tokens = 32;
  o.pad_token_id = -1;  // not a token id: padding is visible
  // Row 1's second token as eos: each row is its greedy ids up to that token's first occurrence.
  const int64_t eos = greedy[1][1].item<int64_t>();
  o.eos_token_ids = {eos};
  const auto out = fabric::models::generate(*model, batch_prompts(gen), o);
  for (int64_t b = 0; b < greedy.size(0); ++b) {
    std::vector<int64_t> expected;
    for (int64_t id : row(greedy[b])) {
      expected.push_back(id);
      if (id == eos) break;
    }
    EXPECT_EQ(out.tokens[b], expected) << "row " << b;
    for (int64_t s = 0; s < out.steps; ++s)
      EXPECT_EQ(out.ids[b][s].item<int64_t>(),
                s < static_cast<int64_t>(expected.size()) ? expected[s] : o.pad_token_id);
  }
  EXPECT_EQ(out.tokens[1].size(), 2u);
  // Every row's third token as eos: all stop by step 3, and generation ends there.
  o.eos_token_ids = row(greedy.select(1, 2));
  const auto early = fabric::models::generate(*model, batch_prompts(gen), o);
  EXPECT_LE(early.steps, 3);
  for (const auto& t : early.tokens) EXPECT_LE(t.size(), 3u);
}

}  // namespace
