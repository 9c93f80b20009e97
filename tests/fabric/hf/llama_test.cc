// fabric::hf::load_llama against Hugging Face transformers: tiny random models built and saved by
// make_llamas.py (transformers, fixed seeds) load here and give transformers' logits, loss and
// gradients to 1e-5 (relative to the largest value); broken folders give one-line errors naming
// the file and the tensor or key.
#include "fabric/hf/llama.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/error.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

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
    std::map<std::string, torch::Tensor> out;
    for (auto& [n, t] : fabric::load_safetensors(dir_ / (name + ".ref.safetensors")).tensors)
      out[n] = t;
    return out;
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

  e = load_error(copy("qwen2", "shallow", [](nlohmann::json& j) { j["num_hidden_layers"] = 1; }));
  EXPECT_NE(e.find("model.safetensors: unexpected tensor model.layers.1."), std::string::npos) << e;

  for (const auto& n : {"no_shard", "wide", "untied", "shallow"})
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

}  // namespace
