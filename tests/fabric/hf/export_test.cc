// fabric::hf::save_llama and save_gpt2 against Hugging Face transformers: the tiny random models of
// make_llamas.py and make_gpt2.py, loaded here, are exported (the Llama with GQA, llama3 rope and
// an untied head, sharded by a small max_shard_bytes; the Qwen2 with biases and tied embeddings;
// the GPT-2), and transformers' AutoModelForCausalLM.from_pretrained loads each folder
// (check_export.py) with float32 logits equal to ours within 1e-5 (relative to the largest value).
// The folders load back here bit for bit; the refusals are one-line errors.
#include "fabric/hf/export.h"

#include <gtest/gtest.h>
#include <torch/utils.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "examples/gpt_recipe.h"
#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/output_check.h"
#include "fabric/checkpoint/safetensors.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/hf/gpt2.h"
#include "fabric/hf/llama.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

class HfExportTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / "hf_export";
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "out");
    for (const char* script : {"make_llamas.py", "make_gpt2.py"}) {
      const auto r = fabric::testing::run_command(python() + " tests/fabric/hf/" + script + " " +
                                                  dir_.string());
      ASSERT_EQ(r.code, 0) << r.out;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string python() {
    const char* p = std::getenv("PYTHON");
    return p ? p : "python3";
  }

  static torch::Tensor ids(const std::string& name) {
    for (auto& [n, t] : fabric::load_safetensors(dir_ / (name + ".ref.safetensors")).tensors)
      if (n == "ids") return t;
    return {};
  }

  // transformers' logits for each exported folder out/NAME on NAME's reference ids.
  static std::map<std::string, torch::Tensor> transformers_logits(
      const std::vector<std::string>& names, const std::string& ids_of) {
    std::string folders;
    for (const auto& n : names) folders += " " + (dir_ / "out" / n).string();
    const auto r =
        fabric::testing::run_command(python() + " tests/fabric/hf/check_export.py " +
                                     (dir_ / (ids_of + ".ref.safetensors")).string() + folders);
    EXPECT_EQ(r.code, 0) << r.out;
    std::map<std::string, torch::Tensor> out;
    for (const auto& n : names)
      out[n] =
          fabric::load_safetensors(dir_ / "out" / (n + ".logits.safetensors")).tensors[0].second;
    return out;
  }

  // max |a - b| / max |b|.
  static double relative(const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  }

  static void expect_equal_state(const fabric::StateDict& a, const fabric::StateDict& b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    }
  }

  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const fabric::Error& e) {
      std::cout << "error: " << e.what() << "\n";
      return e.what();
    }
    return "";
  }

  static fs::path dir_;
};

fs::path HfExportTest::dir_;

TEST_F(HfExportTest, LlamaAndQwen2FoldersLoadInTransformersWithOurLogits) {
  const fs::path out = dir_ / "out";
  fabric::models::Llama llama = fabric::hf::load_llama(dir_ / "llama");
  fabric::hf::save_llama(llama->config(), fabric::state_dict(*llama), out / "llama", 40000);
  fabric::models::Llama qwen = fabric::hf::load_llama(dir_ / "qwen2");
  fabric::hf::save_llama(qwen->config(), fabric::state_dict(*qwen), out / "qwen2", 1 << 30);

  // Sharded as transformers shards: index with total_size and a weight_map; no shard above the
  // limit unless one tensor is.
  ASSERT_TRUE(fs::exists(out / "llama" / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out / "llama" / "model.safetensors"));
  nlohmann::json index;
  std::ifstream(out / "llama" / "model.safetensors.index.json") >> index;
  int64_t total = 0;
  for (const auto& [n, t] : fabric::state_dict(*llama)) total += t.numel() * 4;
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_EQ(index["weight_map"].size(), fabric::state_dict(*llama).size());
  const std::string shard = index["weight_map"]["lm_head.weight"].get<std::string>();
  EXPECT_EQ(shard.substr(0, 6), "model-");
  EXPECT_NE(shard.find("-of-000"), std::string::npos) << shard;
  EXPECT_TRUE(fs::exists(out / "qwen2" / "model.safetensors"));
  EXPECT_FALSE(fs::exists(out / "qwen2" / "model.safetensors.index.json"));
  for (const auto& entry : fs::directory_iterator(out))
    EXPECT_EQ(entry.path().filename().string().find(".partial"), std::string::npos);

  // Bit for bit back here; the configs read back the same.
  expect_equal_state(fabric::state_dict(*fabric::hf::load_llama(out / "llama")),
                     fabric::state_dict(*llama));
  expect_equal_state(fabric::state_dict(*fabric::hf::load_llama(out / "qwen2")),
                     fabric::state_dict(*qwen));
  const auto c = fabric::hf::read_llama_config(out / "llama");
  EXPECT_EQ(c.rope_type, "llama3");
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_TRUE(fabric::hf::read_llama_config(out / "qwen2").qkv_bias);

  const auto theirs = transformers_logits({"llama", "qwen2"}, "llama");
  torch::NoGradGuard no_grad;
  for (auto [name, model] : {std::pair{"llama", llama}, std::pair{"qwen2", qwen}}) {
    const torch::Tensor ours = model->forward(ids("llama"));
    ASSERT_EQ(ours.sizes(), theirs.at(name).sizes());
    const double d = relative(ours, theirs.at(name));
    std::cout << name << ": exported, transformers' logits differ by " << d << " (relative)\n";
    EXPECT_LT(d, 1e-5) << name;
  }
}

TEST_F(HfExportTest, Gpt2FolderLoadsInTransformersWithOurLogits) {
  const fs::path out = dir_ / "out";
  fabric::models::GPT gpt = fabric::hf::load_gpt2(dir_ / "gpt2");
  fabric::models::GPT exact = fabric::hf::load_gpt2(dir_ / "gpt2_bare");
  fabric::hf::ExportExtras extras;
  extras.config = {{"bos_token_id", 95}, {"eos_token_id", 95}};
  fabric::hf::save_gpt2(gpt->config(), fabric::state_dict(*gpt), out / "gpt2", 1 << 30, extras);
  fabric::hf::save_gpt2(exact->config(), fabric::state_dict(*exact), out / "gpt2_exact", 30000);
  EXPECT_TRUE(fs::exists(out / "gpt2_exact" / "model.safetensors.index.json"));
  nlohmann::json config;
  std::ifstream(out / "gpt2" / "config.json") >> config;
  EXPECT_EQ(config["bos_token_id"], 95);
  EXPECT_EQ(config["activation_function"], "gelu_new");
  expect_equal_state(fabric::state_dict(*fabric::hf::load_gpt2(out / "gpt2")),
                     fabric::state_dict(*gpt));
  expect_equal_state(fabric::state_dict(*fabric::hf::load_gpt2(out / "gpt2_exact")),
                     fabric::state_dict(*exact));
  // Conv1D's [in, out], contiguous, as transformers writes it.
  for (const auto& [n, t] : fabric::load_safetensors(out / "gpt2" / "model.safetensors").tensors) {
    if (n == "transformer.h.0.mlp.c_fc.weight") {
      EXPECT_EQ(t.sizes(), at::IntArrayRef({64, 256}));
    }
  }

  const auto theirs = transformers_logits({"gpt2", "gpt2_exact"}, "gpt2");
  torch::NoGradGuard no_grad;
  gpt->eval();
  exact->eval();
  for (auto [name, model] : {std::pair{"gpt2", gpt}, std::pair{"gpt2_exact", exact}}) {
    const torch::Tensor ours = model->forward(ids("gpt2"));
    const double d = relative(ours, theirs.at(name));
    std::cout << name << ": exported, transformers' logits differ by " << d << " (relative)\n";
    EXPECT_LT(d, 1e-5) << name;
  }
}

TEST_F(HfExportTest, ReplacesHfFoldersKeepingOtherFilesAndRefusesOthers) {
  const fs::path out = dir_ / "out";
  fabric::models::GPT gpt = fabric::hf::load_gpt2(dir_ / "gpt2");
  const auto state = fabric::state_dict(*gpt);
  const fs::path folder = out / "again";
  fabric::hf::save_gpt2(gpt->config(), state, folder, 30000);  // sharded
  std::ofstream(folder / "tokenizer.json") << "{}";
  fabric::hf::save_gpt2(gpt->config(), state, folder / "", 1 << 30);  // one file now
  EXPECT_TRUE(fs::exists(folder / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(folder / "model.safetensors"));
  EXPECT_FALSE(fs::exists(folder / "model.safetensors.index.json"));
  for (const auto& entry : fs::directory_iterator(folder))
    EXPECT_EQ(entry.path().filename().string().rfind("model-", 0), std::string::npos);
  EXPECT_FALSE(fs::exists(out / ".again.partial"));
  EXPECT_FALSE(fs::exists(out / ".again.old"));

  fs::create_directories(out / "notes");
  std::ofstream(out / "notes" / "todo.txt") << "x";
  std::string e =
      error_of([&] { fabric::hf::save_gpt2(gpt->config(), state, out / "notes", 1 << 30); });
  EXPECT_NE(e.find("notes: is not empty and not an earlier export (todo.txt); choose a new or "
                   "empty folder"),
            std::string::npos)
      << e;
  EXPECT_TRUE(fs::exists(out / "notes" / "todo.txt"));

  // A model folder that other code wrote (transformers' save_pretrained here) is never replaced:
  // its weights carry no export mark. Its files stay byte for byte.
  const fs::path theirs = out / "theirs";
  fs::copy(dir_ / "gpt2", theirs, fs::copy_options::recursive);
  const auto before = fs::file_size(theirs / "model.safetensors");
  e = error_of([&] { fabric::hf::save_gpt2(gpt->config(), state, theirs, 1 << 30); });
  EXPECT_NE(e.find("theirs: holds a model this project did not export (config.json"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("no export mark in its weights), which the export would replace"),
            std::string::npos)
      << e;
  EXPECT_EQ(fs::file_size(theirs / "model.safetensors"), before);
  EXPECT_FALSE(fabric::is_earlier_export(theirs));
  EXPECT_TRUE(fabric::is_earlier_export(folder));

  // A merged export into an earlier adapter export of ours: the adapter's files go (the folder
  // held both kinds, which transformers loads as base and adapter).
  const fs::path adapter = out / "adapter";
  fs::create_directories(adapter);
  fabric::save_safetensors(adapter / "adapter_model.safetensors", {{"a", torch::ones({2})}},
                           fabric::export_metadata());
  std::ofstream(adapter / "adapter_config.json") << "{}";
  fabric::hf::save_gpt2(gpt->config(), state, adapter, 1 << 30);
  EXPECT_TRUE(fs::exists(adapter / "model.safetensors"));
  EXPECT_FALSE(fs::exists(adapter / "adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(adapter / "adapter_config.json"));

  auto missing = state;
  missing.pop_back();
  e = error_of([&] { fabric::hf::save_gpt2(gpt->config(), missing, out / "m", 1 << 30); });
  EXPECT_NE(e.find("tensor transformer.ln_f.bias [64] is missing from the state"),
            std::string::npos)
      << e;
  auto extra = state;
  extra.emplace_back("lm_head.weight", state[0].second);
  e = error_of([&] { fabric::hf::save_gpt2(gpt->config(), extra, out / "m", 1 << 30); });
  EXPECT_NE(e.find("unexpected tensor lm_head.weight"), std::string::npos) << e;
  auto mixed = state;
  mixed[3].second = mixed[3].second.to(torch::kBFloat16);
  e = error_of([&] { fabric::hf::save_gpt2(gpt->config(), mixed, out / "m", 1 << 30); });
  EXPECT_NE(e.find("convert the state to one dtype"), std::string::npos) << e;
  fabric::models::Llama llama = fabric::hf::load_llama(dir_ / "llama");
  auto cfg = llama->config();
  cfg.intermediate_size = 128;
  e = error_of(
      [&] { fabric::hf::save_llama(cfg, fabric::state_dict(*llama), out / "m", 1 << 30); });
  EXPECT_NE(e.find("tensor model.layers.0.mlp.gate_proj.weight is [96, 64], but the config makes "
                   "it [128, 64]"),
            std::string::npos)
      << e;
  EXPECT_FALSE(fs::exists(out / "m"));
}

// ckpt hf: a checkpoint of examples/gpt (its resolved config recorded, the GPT of model.*, here
// without biases) as a GPT-2 folder, sharded; transformers loads it with our logits.
TEST_F(HfExportTest, CkptHfConvertsAGptCheckpointThatTransformersLoads) {
  const fs::path out = dir_ / "out";
  torch::manual_seed(11);
  const fabric::Config config = fabric::Config::defaults(
      examples::gpt::schema(), {"model.preset=tiny", "model.n_layer=2", "model.bias=false"});
  fabric::models::GPT gpt(examples::gpt::model_config(config, 0));
  {
    torch::NoGradGuard no_grad;  // LayerNorms away from 1 and 0
    for (auto& p : gpt->parameters()) p.add_(torch::randn(p.sizes()) * 0.05);
  }
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [n, t] : fabric::state_dict(*gpt)) model.insert(n, t);
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("model", model);
  state.insert("step", int64_t{3});
  c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", int64_t{1});
  meta.insert("config", config.to_yaml());
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("fabric", meta);
  top.insert("state", state);
  fabric::save_archive(out / "run.ckpt", top);
  const torch::Tensor ids = torch::randint(0, 256, {2, 12}, torch::kLong);
  fabric::save_safetensors(dir_ / "ckpt.ref.safetensors", {{"ids", ids}});

  const std::string ckpt = fs::absolute(fabric::testing::helper_binary("//tools:ckpt")).string();
  auto r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                        "' hf run.ckpt ckpt_gpt --max-shard-bytes=100000");
  ASSERT_EQ(r.code, 0) << r.out;
  std::cout << r.out;
  EXPECT_TRUE(fs::exists(out / "ckpt_gpt" / "model.safetensors.index.json"));
  nlohmann::json json;
  std::ifstream(out / "ckpt_gpt" / "config.json") >> json;
  EXPECT_EQ(json["activation_function"], "gelu_new");  // the GPT's tanh GELU
  EXPECT_EQ(json["vocab_size"], 256);
  EXPECT_EQ(json["n_layer"], 2);

  const auto theirs = transformers_logits({"ckpt_gpt"}, "ckpt");
  torch::NoGradGuard no_grad;
  gpt->eval();
  const double d = relative(gpt->forward(ids), theirs.at("ckpt_gpt"));
  std::cout << "ckpt hf (GPT without biases): transformers' logits differ by " << d
            << " (relative)\n";
  EXPECT_LT(d, 1e-5);

  // Refused like consolidate's OUT (exit 2), and a folder that is not a Hugging Face one (exit 1).
  r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                   "' hf run.ckpt run.ckpt");
  EXPECT_EQ(r.code, 2) << r.out;
  r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                   "' hf run.ckpt other.ckpt");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("other.ckpt: is a checkpoint's name (.ckpt)"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(out / "other.ckpt"));
  fs::create_directories(out / "notes");
  std::ofstream(out / "notes" / "todo.txt") << "x";
  r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                   "' hf run.ckpt notes 2>&1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("notes: is not empty and not an earlier export (todo.txt); choose a new or "
                       "empty folder as OUT"),
            std::string::npos)
      << r.out;
}

// ckpt hf with model.pretrained: the Llama-family architecture of that folder's config.json, its
// generation_config.json copied along; transformers loads the result with our logits.
TEST_F(HfExportTest, CkptHfConvertsAPretrainedQwen2Checkpoint) {
  const fs::path out = dir_ / "out";
  const fs::path folder = dir_ / "qwen2";
  torch::manual_seed(12);
  const fabric::Config config =
      fabric::Config::defaults(examples::gpt::schema(), {"model.pretrained=" + folder.string()});
  fabric::models::Llama qwen = fabric::hf::load_llama(folder);
  {
    torch::NoGradGuard no_grad;  // "trained": not the folder's weights any more
    for (auto& p : qwen->parameters()) p.add_(torch::randn(p.sizes()) * 0.01);
  }
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  for (const auto& [n, t] : fabric::state_dict(*qwen)) model.insert(n, t);
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  state.insert("model", model);
  c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", int64_t{1});
  meta.insert("config", config.to_yaml());
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("fabric", meta);
  top.insert("state", state);
  fabric::save_archive(out / "qwen_run.ckpt", top);

  const std::string ckpt = fs::absolute(fabric::testing::helper_binary("//tools:ckpt")).string();
  auto r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                        "' hf qwen_run.ckpt ckpt_qwen2");
  ASSERT_EQ(r.code, 0) << r.out;
  std::cout << r.out;
  EXPECT_TRUE(fs::exists(out / "ckpt_qwen2" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(out / "ckpt_qwen2" / "generation_config.json"));
  EXPECT_TRUE(fabric::hf::read_llama_config(out / "ckpt_qwen2").tie_word_embeddings);

  // The folder model.pretrained names (transformers wrote it: no export mark) is never the
  // output; our own earlier export is replaced.
  r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                   "' hf qwen_run.ckpt '" + folder.string() + "'");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("qwen2: holds a model this project did not export"), std::string::npos)
      << r.out;
  r = fabric::testing::run_command("cd '" + out.string() + "' && '" + ckpt +
                                   "' hf qwen_run.ckpt ckpt_qwen2");
  ASSERT_EQ(r.code, 0) << r.out;

  const auto theirs = transformers_logits({"ckpt_qwen2"}, "llama");
  torch::NoGradGuard no_grad;
  const double d = relative(qwen->forward(ids("llama")), theirs.at("ckpt_qwen2"));
  std::cout << "ckpt hf (model.pretrained qwen2): transformers' logits differ by " << d
            << " (relative)\n";
  EXPECT_LT(d, 1e-5);
}

}  // namespace
