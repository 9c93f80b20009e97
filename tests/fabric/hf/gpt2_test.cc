// fabric::hf::load_gpt2 against Hugging Face transformers: tiny random GPT-2 models built and saved
// by make_gpt2.py (transformers, fixed seeds) load here and give transformers' logits, loss and
// gradients to 1e-5 (relative to the largest value), in transformers 5's layout and in the
// original openai-community/gpt2 one (bare names, attn.bias buffers); broken folders give
// one-line errors naming the file and the key or tensor. Greedy generation with the key/value
// cache (fabric/models/gpt_generate.h) gives transformers' generate(do_sample=False) ids, for one
// prompt and for a left-padded batch of prompts of different lengths.
#include "fabric/hf/gpt2.h"

#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/error.h"
#include "fabric/models/gpt_generate.h"
#include "tests/fabric/hf/generation_testing.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

bool conv1d(const std::string& name) {
  for (const char* s :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"}) {
    const std::string suffix = s;
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return true;
  }
  return false;
}

class Gpt2HfTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / "hf_gpt2";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const char* python = std::getenv("PYTHON");
    const auto r = fabric::testing::run_command(std::string(python ? python : "python3") +
                                                " tests/fabric/hf/make_gpt2.py " + dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::map<std::string, torch::Tensor> reference(const std::string& name) {
    return fabric::testing::tensors_of(dir_ / (name + ".ref.safetensors"));
  }

  // max |a - b| / max |b|.
  static double relative(const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  }

  // Logits, loss and every gradient of `name`'s folder against transformers'.
  static void check_against_transformers(const std::string& name) {
    SCOPED_TRACE(name);
    fabric::models::GPT model = fabric::hf::load_gpt2(dir_ / name);
    model->eval();
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
      const auto it = ref.find("grad." + item.key());  // transformers 5's names are the GPT's
      ASSERT_NE(it, ref.end()) << "transformers has no parameter " << item.key();
      ASSERT_TRUE(item.value().grad().defined()) << item.key();
      const torch::Tensor grad = conv1d(item.key()) ? item.value().grad().t() : item.value().grad();
      ASSERT_EQ(grad.sizes(), it->second.sizes()) << item.key();
      const double dg = relative(grad, it->second);
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

  // The message of the fabric::Error load_gpt2 throws for `folder` ("" if none).
  static std::string load_error(const fs::path& folder) {
    try {
      fabric::hf::load_gpt2(folder);
    } catch (const fabric::Error& e) {
      std::cout << "error: " << e.what() << "\n";
      return e.what();
    }
    return "";
  }

  static fs::path dir_;
};

fs::path Gpt2HfTest::dir_;

TEST_F(Gpt2HfTest, ReadsTheConfigsTransformersWrote) {
  const auto c = fabric::hf::read_gpt2_config(dir_ / "gpt2");
  EXPECT_EQ(c.vocab_size, 96);  // unpadded, as the file says
  EXPECT_EQ(c.block_size, 32);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.gelu, "tanh");
  EXPECT_DOUBLE_EQ(c.layer_norm_epsilon, 1e-5);
  EXPECT_DOUBLE_EQ(c.dropout, 0.0);
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(fabric::hf::read_gpt2_config(dir_ / "gpt2_bare" / "config.json").gelu, "none");
}

TEST_F(Gpt2HfTest, Gpt2MatchesTransformers) { check_against_transformers("gpt2"); }

TEST_F(Gpt2HfTest, OriginalLayoutWithBareNamesAndExactGeluMatchesTransformers) {
  const auto w = fabric::hf::gpt2_weights(fabric::hf::read_weights(dir_ / "gpt2_bare"));
  for (const auto& [name, tensor] : w.tensors) {
    EXPECT_EQ(name.rfind("transformer.", 0), 0u) << name;
    EXPECT_EQ(w.file.at(name), dir_ / "gpt2_bare" / "model.safetensors");
  }
  check_against_transformers("gpt2_bare");
}

// Greedy ids with the key/value cache against transformers' generate(do_sample=False,
// max_new_tokens=20) in float32: one prompt, and a batch of 3 prompts of lengths 5, 9, 3
// (transformers: left padding, attention_mask and the positions it derives from it; here: the
// same, one batch). Both layouts, both GELU forms.
TEST_F(Gpt2HfTest, GreedyGenerationWithKvCacheMatchesTransformers) {
  using fabric::testing::row;
  for (const std::string name : {"gpt2", "gpt2_bare"}) {
    SCOPED_TRACE(name);
    fabric::models::GPT model = fabric::hf::load_gpt2(dir_ / name);
    const auto gen = fabric::testing::tensors_of(dir_ / (name + ".gen.safetensors"));
    fabric::models::GenerateOptions o;
    o.max_new_tokens = 20;
    const auto single = fabric::models::generate(*model, {row(gen.at("single.prompt"))}, o);
    EXPECT_TRUE(torch::equal(single.ids, gen.at("single.new")))
        << "got " << single.ids << "\ntransformers " << gen.at("single.new");
    const auto prompts = fabric::testing::batch_prompts(gen);
    const auto batch = fabric::models::generate(*model, prompts, o);
    EXPECT_TRUE(torch::equal(batch.ids, gen.at("batch.new")))
        << "got " << batch.ids << "\ntransformers " << gen.at("batch.new");
    EXPECT_EQ(batch.steps, 20);
    // The cache changes nothing: each row alone equals argmax of a full forward every step.
    for (size_t b = 0; b < prompts.size(); ++b)
      EXPECT_EQ(batch.tokens[b], fabric::testing::greedy_without_cache(model, prompts[b], 20))
          << "row " << b;
    EXPECT_TRUE(model->is_training());  // the mode it was loaded in, restored
    std::cout << name << ": decode " << batch.decode_tokens_per_second << " tokens/s (batch of 3, "
              << batch.steps - 1 << " steps, CPU)\n";
  }
}

TEST_F(Gpt2HfTest, GenerationBeyondThePositionsOrVocabularyIsOneLine) {
  fabric::models::GPT model = fabric::hf::load_gpt2(dir_ / "gpt2");
  auto error = [&](const std::vector<int64_t>& prompt, int64_t n) -> std::string {
    fabric::models::GenerateOptions o;
    o.max_new_tokens = n;
    try {
      fabric::models::generate(*model, {prompt}, o);
    } catch (const fabric::Error& e) {
      std::cout << "error: " << e.what() << "\n";
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error(std::vector<int64_t>(12, 1), 20), "");  // 32 positions: exactly full
  EXPECT_NE(error(std::vector<int64_t>(13, 1), 20)
                .find("generate: prompt 0: 13 tokens + max_new_tokens 20 exceed block_size "
                      "(config.json's n_positions) 32"),
            std::string::npos);
  EXPECT_NE(error({5, 96}, 4).find("token id 96 is outside the vocabulary [0, 96)"),
            std::string::npos);
}

TEST_F(Gpt2HfTest, BrokenFoldersAreOneLineErrorsNamingTheFileAndKey) {
  std::map<std::string, std::string> expected = {
      {"relu", "config.json: activation_function: 'relu' is not supported"},
      {"inner", "config.json: n_inner: 100 is not supported"},
      {"untied", "config.json: tie_word_embeddings: false is not supported"},
      {"llama", "config.json: model_type: 'llama' is not gpt2"},
      {"no_embd", "config.json: n_embd: missing; a GPT-2 config.json names it"},
      {"upcast", "config.json: reorder_and_upcast_attn: true is not supported"},
      // config.json's sizes against the weights', before the model is built.
      {"shallow",
       "config.json: n_layer 1, but the weights hold 2 layers (model.safetensors); "
       "config.json and the weights must describe the same model"},
      {"deep", "config.json: n_layer 3, but the weights hold 2 layers"},
      {"wide",
       "config.json: vocab_size 96 and n_embd 80 make the token embedding [96, 80], but "
       "transformer.wte.weight is [96, 64] in model.safetensors"},
      {"positions", "tensor transformer.wpe.weight is [32, 64], but"},
  };
  copy("gpt2", "relu", [](nlohmann::json& j) { j["activation_function"] = "relu"; });
  copy("gpt2", "inner", [](nlohmann::json& j) { j["n_inner"] = 100; });
  copy("gpt2", "untied", [](nlohmann::json& j) { j["tie_word_embeddings"] = false; });
  copy("gpt2", "llama", [](nlohmann::json& j) { j["model_type"] = "llama"; });
  copy("gpt2", "no_embd", [](nlohmann::json& j) { j.erase("n_embd"); });
  copy("gpt2", "upcast", [](nlohmann::json& j) { j["reorder_and_upcast_attn"] = true; });
  copy("gpt2_bare", "shallow", [](nlohmann::json& j) { j["n_layer"] = 1; });
  copy("gpt2", "deep", [](nlohmann::json& j) { j["n_layer"] = 3; });
  copy("gpt2", "wide", [](nlohmann::json& j) {
    j["n_embd"] = 80;
    j["n_head"] = 5;
  });
  // Past the size check (layers and token embedding agree): the first tensor that differs.
  copy("gpt2", "positions", [](nlohmann::json& j) { j["n_positions"] = 40; });
  for (const auto& [name, text] : expected) {
    SCOPED_TRACE(name);
    const std::string e = load_error(dir_ / name);
    EXPECT_NE(e.find(text), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  EXPECT_NE(load_error(dir_ / "absent").find("absent: no such folder"), std::string::npos);
}

TEST(Gpt2Config, AnUnknownGeluFormIsRefused) {
  fabric::models::GPTConfig c = fabric::models::GPTConfig::preset("tiny");
  c.gelu = "sigmoid";
  try {
    fabric::models::GPT model(c);
    ADD_FAILURE() << "built";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("GPTConfig.gelu: 'sigmoid'"), std::string::npos);
  }
}

}  // namespace
