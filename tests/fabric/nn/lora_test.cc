// fabric::nn LoRA against Hugging Face peft: make_lora.py saves a tiny random transformers Llama,
// a peft adapter on q_proj, v_proj and down_proj (lora_B random so gradients reach lora_A) and
// peft's logits, loss, adapter gradients and merged logits. Here fabric::hf::load_llama +
// apply_lora + the adapter file give the same to 1e-5 (relative to the largest value), with no
// gradient on the frozen base; merge_lora keeps the logits; our save_lora_adapter loads in peft
// with our logits; mistakes give one-line errors; one step under 2-process ddp
// and fsdp equals one process.
#include "fabric/nn/lora.h"

#include <gtest/gtest.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/error.h"
#include "fabric/hf/llama.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/tensor_parallel.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

const char kScript[] = "tests/fabric/nn/make_lora.py";

class LoraTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / "lora";
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    const auto r = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                                kScript + " " + dir_.string());
    ASSERT_EQ(r.code, 0) << r.out;
    for (auto& [n, t] : fabric::load_safetensors(dir_ / "ref.safetensors").tensors) ref_[n] = t;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static fabric::nn::LoraOptions peft_options() {
    fabric::nn::LoraOptions o;
    o.rank = 4;
    o.alpha = 8;
    o.target_modules = {"q_proj", "v_proj", "down_proj"};
    return o;
  }
  // The base folder's Llama with peft's adapter on it.
  static fabric::models::Llama adapted() {
    fabric::models::Llama model = fabric::hf::load_llama(dir_ / "base");
    const auto names = fabric::nn::apply_lora(*model, peft_options());
    EXPECT_EQ(names.size(), 6u);
    fabric::nn::load_lora_state(*model, fabric::nn::read_lora_state(dir_ / "adapter"));
    return model;
  }
  static torch::Tensor logits(fabric::models::Llama& model) {
    torch::NoGradGuard no_grad;
    model->eval();
    return model->forward(ref_.at("ids"));
  }
  // max |a - b| / max |b|.
  static double relative(const torch::Tensor& a, const torch::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  }

  static fs::path dir_;
  static std::map<std::string, torch::Tensor> ref_;
};
fs::path LoraTest::dir_;
std::map<std::string, torch::Tensor> LoraTest::ref_;

TEST_F(LoraTest, OneStepEqualsPeftLossAndAdapterGradients) {
  fabric::models::Llama model = adapted();
  EXPECT_LT(relative(logits(model), ref_.at("logits")), 1e-5);

  model->train();
  const torch::Tensor ids = ref_.at("ids");
  const int64_t T = ids.size(1);
  const torch::Tensor loss = model->loss(ids.narrow(1, 0, T - 1), ids.narrow(1, 1, T - 1));
  loss.backward();
  const double dl = relative(loss.detach().reshape({1}), ref_.at("loss"));
  EXPECT_LT(dl, 1e-5);
  int adapters = 0;
  double worst = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const bool adapter =
        name.find(".lora_A.") != std::string::npos || name.find(".lora_B.") != std::string::npos;
    if (!adapter) {
      EXPECT_FALSE(item.value().requires_grad()) << name;
      EXPECT_FALSE(item.value().grad().defined()) << name;
      continue;
    }
    ++adapters;
    const std::string key = "grad.base_model.model." + name;
    ASSERT_TRUE(ref_.count(key)) << key;
    ASSERT_TRUE(item.value().grad().defined()) << name;
    const double d = relative(item.value().grad(), ref_.at(key));
    worst = std::max(worst, d);
    EXPECT_LT(d, 1e-5) << name;
  }
  EXPECT_EQ(adapters, 12);
  std::cout << "loss relative difference " << dl << ", worst adapter gradient " << worst << "\n";
}

TEST_F(LoraTest, MergeKeepsTheLogitsAndEqualsPeftsMergeAndUnload) {
  fabric::models::Llama model = adapted();
  const torch::Tensor before = logits(model);
  EXPECT_EQ(fabric::nn::merge_lora(*model).size(), 6u);
  EXPECT_TRUE(fabric::nn::lora_state(*model).empty());
  for (const auto& item : model->named_parameters())
    EXPECT_EQ(item.key().find("lora_"), std::string::npos) << item.key();
  const torch::Tensor after = logits(model);
  EXPECT_LT(relative(after, before), 1e-5);
  EXPECT_LT(relative(after, ref_.at("merged_logits")), 1e-5);
}

TEST_F(LoraTest, SavedAdapterLoadsInPeftWithOurLogits) {
  fabric::models::Llama model = adapted();
  const fs::path folder = dir_ / "ours";
  fabric::nn::save_lora_adapter(*model, folder, peft_options(), "tiny-llama");
  const auto r =
      fabric::testing::run_command(fabric::testing::python_interpreter() + " " + kScript + " " +
                                   dir_.string() + " " + folder.string());
  ASSERT_EQ(r.code, 0) << r.out;
  const auto peft = fabric::load_safetensors(dir_ / "ours.logits.safetensors").tensors;
  ASSERT_EQ(peft.size(), 1u);
  EXPECT_LT(relative(logits(model), peft[0].second), 1e-5);

  // And back: the folder's options and tensors rebuild the same model.
  const fabric::nn::LoraOptions o = fabric::nn::read_lora_options(folder);
  EXPECT_EQ(o.rank, 4);
  EXPECT_EQ(o.alpha, 8);
  EXPECT_EQ(o.target_modules, peft_options().target_modules);
  fabric::models::Llama again = fabric::hf::load_llama(dir_ / "base");
  fabric::nn::apply_lora(*again, o);
  fabric::nn::load_lora_state(*again, fabric::nn::read_lora_state(folder));
  EXPECT_TRUE(torch::equal(logits(again), logits(model)));
}

// An adapter exported into an earlier merged export of ours replaces its model files (the folder
// held both, which transformers loads as base and adapter); a downloaded model's folder beside
// which an adapter of ours was copied is not an earlier export: refused, its files kept.
TEST_F(LoraTest, AdapterExportReplacesAnEarlierMergedExportOnly) {
  fabric::models::Llama model = adapted();
  const std::map<std::string, std::string> mark = {{"format", "pt"}, {"exported_by", "fabric++"}};
  const fs::path merged = dir_ / "merged";
  fs::create_directories(merged);
  fabric::save_safetensors(merged / "model.safetensors", {{"w", torch::ones({2})}}, mark);
  std::ofstream(merged / "config.json") << "{}";
  std::ofstream(merged / "tokenizer.json") << "{}";
  fabric::nn::save_lora_adapter(*model, merged, peft_options(), "tiny-llama");
  EXPECT_TRUE(fs::exists(merged / "adapter_model.safetensors"));
  EXPECT_TRUE(fs::exists(merged / "adapter_config.json"));
  EXPECT_TRUE(fs::exists(merged / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(merged / "model.safetensors"));
  EXPECT_FALSE(fs::exists(merged / "config.json"));

  const fs::path theirs = dir_ / "theirs";
  fs::create_directories(theirs);
  fabric::save_safetensors(theirs / "model.safetensors", {{"w", torch::ones({2})}});
  fs::copy_file(merged / "adapter_model.safetensors", theirs / "adapter_model.safetensors");
  try {
    fabric::nn::save_lora_adapter(*model, theirs, peft_options(), "tiny-llama");
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds a model this project did not export"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::exists(theirs / "model.safetensors"));
}

// An adapter on an untied lm_head (peft may target it) is in the loss: the loss went through the
// raw weight, so its adapter got no gradient and never trained.
TEST_F(LoraTest, AnAdapterOnTheOutputLayerIsInTheLoss) {
  fabric::models::Llama model = fabric::hf::load_llama(dir_ / "base");
  fabric::nn::LoraOptions o = peft_options();
  o.target_modules = {"lm_head"};
  ASSERT_EQ(fabric::nn::apply_lora(*model, o).size(), 1u);
  {
    torch::NoGradGuard no_grad;
    model->lm_head->lora_B->weight.normal_();  // nonzero: the adapter changes the logits
  }
  const torch::Tensor ids = ref_.at("ids");
  const torch::Tensor inputs = ids.narrow(1, 0, 11), targets = ids.narrow(1, 1, 11);
  const torch::Tensor loss = model->loss(inputs, targets);
  const torch::Tensor logits = model->forward(inputs);
  EXPECT_NEAR(loss.item<double>(),
              torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), targets.reshape(-1))
                  .item<double>(),
              1e-5);
  loss.backward();
  ASSERT_TRUE(model->lm_head->lora_A->weight.grad().defined());
  EXPECT_GT(model->lm_head->lora_A->weight.grad().abs().max().item<double>(), 0);
}

// adapter_config.json says what the model holds: target_modules that peft matches to exactly the
// adapted layers (it knows no '*': "layers.*.mlp.down_proj" matched nothing there), and the rank
// and alpha the adapters have (other options were written as given: another scaling in peft).
TEST_F(LoraTest, SavedTargetsAreTheAdaptedLayersAndOptionsMustBeTheirs) {
  const auto targets_saved = [&](const std::vector<std::string>& patterns) {
    fabric::models::Llama model = fabric::hf::load_llama(dir_ / "base");
    fabric::nn::LoraOptions o = peft_options();
    o.target_modules = patterns;
    fabric::nn::apply_lora(*model, o);
    const fs::path folder = dir_ / "targets";
    fs::remove_all(folder);
    fabric::nn::save_lora_adapter(*model, folder, o, "tiny-llama");
    return nlohmann::json::parse(std::ifstream(folder / "adapter_config.json"))["target_modules"]
        .get<std::vector<std::string>>();
  };
  EXPECT_EQ(targets_saved({"layers.*.mlp.down_proj"}), std::vector<std::string>{"down_proj"});
  EXPECT_EQ(
      targets_saved({"layers.0.mlp.down_proj", "v_proj"}),
      (std::vector<std::string>{"model.layers.0.mlp.down_proj", "model.layers.0.self_attn.v_proj",
                                "model.layers.1.self_attn.v_proj"}));
  fabric::models::Llama model = adapted();
  fabric::nn::LoraOptions other = peft_options();
  other.alpha = 16;
  try {
    fabric::nn::save_lora_adapter(*model, dir_ / "other", other, "tiny-llama");
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("has an adapter of rank 4 and scaling 2, the options "
                                         "rank 4 and alpha 16 (scaling 4)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(dir_ / "other"));
}

TEST_F(LoraTest, FreshAdaptersLeaveTheOutputBitwiseAndPatternsMatchSuffixes) {
  fabric::models::Llama base = fabric::hf::load_llama(dir_ / "base");
  fabric::models::Llama model = fabric::hf::load_llama(dir_ / "base");
  fabric::nn::LoraOptions o;
  o.rank = 2;
  o.target_modules = {"layers.*.mlp.*", "model.layers.1.self_attn.o_proj"};
  const auto names = fabric::nn::apply_lora(*model, o);
  ASSERT_EQ(names.size(), 7u);  // gate, up, down of 2 layers + one o_proj
  EXPECT_EQ(names.back(), "model.layers.1.mlp.down_proj");
  EXPECT_TRUE(torch::equal(logits(model), logits(base)));  // B = 0: + 0 exactly
  EXPECT_EQ(fabric::nn::lora_state(*model).size(), 14u);
  // A second call adds adapters elsewhere; the first ones keep training.
  o.target_modules = {"model.layers.0.self_attn.k_proj"};
  EXPECT_EQ(fabric::nn::apply_lora(*model, o).size(), 1u);
  int trainable = 0;
  for (const auto& p : model->parameters()) trainable += p.requires_grad() ? 1 : 0;
  EXPECT_EQ(trainable, 16);
  // A layer with an adapter clones (dp's replicas) with it.
  auto copy =
      std::dynamic_pointer_cast<fabric::nn::LinearImpl>(model->layers[0]->mlp->down_proj->clone());
  ASSERT_TRUE(copy);
  EXPECT_EQ(copy->lora_rank(), 2);
  const torch::Tensor x = torch::randn({3, 96});
  EXPECT_TRUE(torch::equal(copy->forward(x), model->layers[0]->mlp->down_proj->forward(x)));
}

// Dropout (peft's: on the adapter's input only, in training mode): eval is the dropout-free
// output, training drops inputs of the adapter and never of the base.
TEST(Lora, DropoutOnTheAdaptersInputInTrainingOnly) {
  torch::manual_seed(0);
  fabric::nn::Linear layer(16, 8);
  layer->set_lora(4, 2.0, 0.5);
  torch::nn::init::normal_(layer->lora_B->weight);
  const torch::Tensor x = torch::randn({5, 16});
  const torch::Tensor base = torch::linear(x, layer->weight, layer->bias);
  const torch::Tensor full =
      base + torch::linear(torch::linear(x, layer->lora_A->weight), layer->lora_B->weight) * 2.0;
  layer->eval();
  EXPECT_TRUE(torch::allclose(layer->forward(x), full, 1e-6, 1e-6));
  layer->train();
  torch::manual_seed(1);
  const torch::Tensor dropped = layer->forward(x);
  torch::manual_seed(1);
  const torch::Tensor kept = torch::dropout(x, 0.5, true);  // the same draw
  const torch::Tensor expected =
      base + torch::linear(torch::linear(kept, layer->lora_A->weight), layer->lora_B->weight) * 2.0;
  EXPECT_TRUE(torch::allclose(dropped, expected, 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(dropped, full, 1e-3, 1e-3));
}

// A split layer's adapter is cut with it, in either order (apply_lora before or after the
// split): a column layer's lora_B by rows, a row layer's lora_A by columns (LinearImpl::lora_cut;
// the parity of the cut adapters runs in tensor_parallel_test and finetune_example_test).
TEST(Lora, SplitLayersCutTheirAdapterLikeTheWeight) {
  using fabric::nn::TensorParallelStyle;
  auto shard = [](TensorParallelStyle style, int64_t dim) {
    fabric::nn::TensorParallelShard s({}, style, 0, 1, dim, {8, 16});
    s.module_name = "fc";
    return s;
  };
  for (bool row : {false, true}) {
    for (bool lora_first : {false, true}) {
      torch::nn::Sequential net;
      net->push_back("fc", fabric::nn::Linear(16, 8));
      auto* fc = net[0]->as<fabric::nn::LinearImpl>();
      fabric::nn::LoraOptions o;
      o.rank = 2;
      o.target_modules = {"fc"};
      const auto split = [&] {
        fc->set_parallel(row ? shard(TensorParallelStyle::row(), 1)
                             : shard(TensorParallelStyle::column(), 0));
      };
      EXPECT_FALSE(fc->lora_cut().has_value());
      if (!lora_first) split();
      EXPECT_EQ(fabric::nn::apply_lora(*net, o), std::vector<std::string>{"fc"});
      if (lora_first) split();
      const auto cut = fc->lora_cut();
      ASSERT_TRUE(cut.has_value());
      EXPECT_EQ(cut->name, row ? "lora_A.weight" : "lora_B.weight");
      EXPECT_EQ(cut->along, row ? 1 : 0);
      EXPECT_EQ(cut->whole_sizes, (row ? std::vector<int64_t>{2, 16} : std::vector<int64_t>{8, 2}));
      EXPECT_TRUE(cut->tensor.is_same(row ? fc->lora_A->weight : fc->lora_B->weight));
      fc->clear_lora();
      EXPECT_FALSE(fc->lora_cut().has_value());
    }
  }
}

// Under an empty init (fabric/nn/empty_init.h) apply_lora inside the recording: the adapters are
// meta tensors until materialized, then hold a full construction's values (A drawn after the
// base from the same generator, B zeros), frozen base and all. On a meta base outside a recording
// it is refused (its adapters would have no values).
TEST(Lora, AnEmptyInitsAdaptersGetAFullConstructionsValues) {
  fabric::nn::LoraOptions o;
  o.rank = 2;
  o.target_modules = {"fc"};
  auto build = [&](bool lora) {
    torch::nn::Sequential net;
    net->push_back("fc", fabric::nn::Linear(16, 8));
    if (lora) fabric::nn::apply_lora(*net, o);
    return net;
  };
  torch::manual_seed(5);
  const torch::nn::Sequential full = build(true);
  torch::manual_seed(5);
  torch::nn::Sequential empty{nullptr};
  std::shared_ptr<fabric::InitRecord> record;
  {
    fabric::EmptyInit scope;
    empty = build(true);
    record = scope.record();
  }
  EXPECT_TRUE(empty[0]->as<fabric::nn::LinearImpl>()->lora_A->weight.is_meta());
  fabric::materialize(*empty, *record, torch::kCPU);
  const auto want = full->named_parameters(), got = empty->named_parameters();
  ASSERT_EQ(got.size(), 4u);  // weight, bias, lora_A, lora_B
  for (const auto& p : want) {
    ASSERT_TRUE(got.contains(p.key())) << p.key();
    EXPECT_TRUE(torch::equal(got[p.key()], p.value())) << p.key();
    EXPECT_EQ(got[p.key()].requires_grad(), p.value().requires_grad()) << p.key();
    EXPECT_EQ(fabric::nn::is_lora_tensor(p.key()), p.value().requires_grad()) << p.key();
  }
  EXPECT_GT(got["fc.lora_A.weight"].abs().sum().item<double>(), 0);
  EXPECT_EQ(got["fc.lora_B.weight"].abs().sum().item<double>(), 0);
  // Built empty, adapted after the recording ended: refused, naming what to do.
  torch::nn::Sequential meta{nullptr};
  {
    fabric::EmptyInit scope;
    meta = build(false);
  }
  try {
    fabric::nn::apply_lora(*meta, o);
    ADD_FAILURE() << "apply_lora took a meta base outside a recording";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("init_module"), std::string::npos) << e.what();
  }
}

TEST_F(LoraTest, MistakesAreOneLineErrors) {
  fabric::models::Llama model = fabric::hf::load_llama(dir_ / "base");
  auto message = [&](fabric::nn::LoraOptions o) -> std::string {
    try {
      fabric::nn::apply_lora(*model, o);
    } catch (const fabric::Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << m;
      return m;
    }
    return "no error";
  };
  fabric::nn::LoraOptions o = peft_options();
  o.target_modules = {"q_prj"};
  std::string m = message(o);
  EXPECT_NE(m.find("'q_prj' matches no fabric::nn::Linear"), std::string::npos) << m;
  EXPECT_NE(m.find("closest first: 'q_proj'"), std::string::npos) << m;
  o = peft_options();
  o.rank = 0;
  m = message(o);
  EXPECT_NE(m.find("rank must be at least 1"), std::string::npos) << m;
  o.rank = 65;  // q_proj is [64, 64]
  m = message(o);
  EXPECT_NE(m.find("rank 65 is larger than layer 'model.layers.0.self_attn.q_proj'"),
            std::string::npos)
      << m;
  o = peft_options();
  o.target_modules = {};
  EXPECT_NE(message(o).find("target_modules is empty"), std::string::npos);
  // Nothing changed by the refused calls: every parameter still trains.
  for (const auto& p : model->parameters()) EXPECT_TRUE(p.requires_grad());
  // Twice on one layer.
  o = peft_options();
  fabric::nn::apply_lora(*model, o);
  EXPECT_NE(message(o).find("has an adapter already"), std::string::npos);
  // An adapter file of another model.
  auto state = fabric::nn::lora_state(*model);
  state[0].second = torch::zeros({3, 3});
  try {
    fabric::nn::load_lora_state(*model, state);
    ADD_FAILURE() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is [3, 3], the model's adapter [4, 64]"),
              std::string::npos)
        << e.what();
  }
  // A peft folder whose adapter_config.json was edited: its r named by the file's key, and an r
  // that its tensors contradict (not "another base model").
  const fs::path edited = dir_ / "edited";
  fs::remove_all(edited);
  fs::copy(dir_ / "adapter", edited);
  auto config = nlohmann::json::parse(std::ifstream(edited / "adapter_config.json"));
  auto error_reading = [&](int64_t r) -> std::string {
    config["r"] = r;
    std::ofstream(edited / "adapter_config.json") << config.dump();
    try {
      fabric::nn::read_lora_options(edited);
      fabric::nn::read_lora_state(edited);
    } catch (const fabric::Error& e) {
      return e.what();
    }
    return "no error";
  };
  m = error_reading(0);
  EXPECT_NE(m.find("adapter_config.json: r is 0; a LoRA rank is at least 1"), std::string::npos)
      << m;
  m = error_reading(8);
  EXPECT_NE(m.find("has rank 4 but adapter_config.json's r is 8; the folder's two files come from "
                   "different adapters"),
            std::string::npos)
      << m;
  // What peft varies per module (alpha_pattern scaled v_proj 4x in peft, not here) is refused
  // by name; its empty defaults, and a peft_type that is not a string, read cleanly or as such.
  config["r"] = 4;
  config["alpha_pattern"] = {{"v_proj", 32}};
  std::ofstream(edited / "adapter_config.json") << config.dump();
  m = error_reading(4);
  EXPECT_NE(m.find("adapter_config.json: alpha_pattern: {\"v_proj\":32} is not supported"),
            std::string::npos)
      << m;
  config["alpha_pattern"] = nlohmann::json::object();
  config["peft_type"] = nullptr;
  m = error_reading(4);
  EXPECT_NE(m.find("adapter_config.json: peft_type must be LORA (got none)"), std::string::npos)
      << m;
}

// One SGD step of the adapters under 2-process ddp and fsdp (one row of the batch each; fsdp in
// a unit per block) equals one process on both rows; no base parameter gets a gradient or
// changes on any rank: the reducer, fsdp's shards and the optimizer hold the adapters only; fsdp
// keeps half the frozen base per rank (its frozen units), ddp all of it.
TEST_F(LoraTest, DdpAndFsdpStepOfTheAdaptersEqualsOneProcess) {
  const std::string exe = fabric::testing::helper_binary("//tests/fabric/nn:lora_ddp_helper");
  const fs::path out = dir_ / "ddp";
  fs::create_directories(out);
  auto run = [&](const std::string& args, int world) {
    const auto r = fabric::testing::run_command(
        "'" + exe + "' fabric.accelerator=cpu test.folder=" + dir_.string() +
        " test.out=" + out.string() + " " + args);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(
        fabric::testing::ranks_missing_report(r.out, world, " base_grads=0 base_changed=0").empty())
        << r.out;
    long long held = 0, total = 0;  // "H of T"
    const bool read = std::sscanf(fabric::testing::value_after(r.out, "base_held=").c_str(),
                                  "%lld of %lld", &held, &total) == 2;
    EXPECT_TRUE(read && total > 0) << r.out;
    if (read && total > 0) {
      const double fraction = static_cast<double>(held) / static_cast<double>(total);
      std::cout << args << ": base elements kept per rank " << held << " of " << total << "\n";
      // fsdp 2: half, plus each frozen unit's alignment padding (measured 0.50x).
      if (args.find("fsdp") != std::string::npos) {
        EXPECT_LT(fraction, 0.55) << r.out;
      } else {
        EXPECT_EQ(fraction, 1.0) << r.out;
      }
    }
    const std::string loss = fabric::testing::value_after(r.out, "loss=");
    return loss.empty() ? -1.0 : std::stod(loss);
  };
  std::map<std::string, torch::Tensor> initial;
  for (auto& [n, t] : fabric::nn::read_lora_state(dir_ / "adapter")) initial[n] = t;
  const double l1 = run("fabric.devices=1", 1);
  const auto a1 = fabric::load_safetensors(out / "adapters1.safetensors").tensors;
  ASSERT_EQ(a1.size(), 12u);
  for (const char* strategy :
       {"fabric.strategy=ddp", "fabric.strategy=fsdp fabric.fsdp.wrap_modules=LlamaDecoderLayer"}) {
    SCOPED_TRACE(strategy);
    const double l2 = run(std::string("fabric.devices=2 ") + strategy, 2);
    EXPECT_NEAR(l2, l1, 1e-6 * std::abs(l1));
    const auto a2 = fabric::load_safetensors(out / "adapters2.safetensors").tensors;
    ASSERT_EQ(a2.size(), a1.size());
    double worst = 0;
    for (size_t i = 0; i < a1.size(); ++i) {
      ASSERT_EQ(a1[i].first, a2[i].first);
      EXPECT_FALSE(torch::equal(a1[i].second, initial.at(a1[i].first))) << a1[i].first;
      const torch::Tensor step = a1[i].second - initial.at(a1[i].first);
      worst = std::max(worst, relative(a2[i].second - initial.at(a1[i].first), step));
    }
    // The rows' float32 gradients summed in another order: measured 5.4e-6 of the step (ddp).
    EXPECT_LT(worst, 5e-5);
    std::cout << strategy << " 2 vs 1 process: loss " << l2 << " vs " << l1
              << ", worst adapter step difference " << worst << "\n";
  }
  // A float8 base (store_lora_base, per-row scales): fsdp broadcasts, shards and gathers it as
  // bytes (Gloo has no float8); its step equals ddp's, and differs from the float32 base's.
  std::vector<double> losses;
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> steps;
  for (const char* strategy :
       {"fabric.strategy=ddp", "fabric.strategy=fsdp fabric.fsdp.wrap_modules=LlamaDecoderLayer"}) {
    SCOPED_TRACE(std::string(strategy) + " fp8");
    losses.push_back(run(std::string("fabric.devices=2 test.base_dtype=fp8 ") + strategy, 2));
    steps.push_back(fabric::load_safetensors(out / "adapters2.safetensors").tensors);
  }
  EXPECT_EQ(losses[1], losses[0]);
  EXPECT_GT(std::abs(losses[0] - l1), 1e-6 * std::abs(l1));  // the stored base's rounding
  ASSERT_EQ(steps[1].size(), a1.size());
  for (size_t i = 0; i < a1.size(); ++i)
    EXPECT_TRUE(torch::equal(steps[1][i].second, steps[0][i].second)) << steps[0][i].first;
  std::cout << "fp8 base: loss " << losses[0] << " (ddp) " << losses[1] << " (fsdp), float32 base "
            << l1 << "\n";
}

}  // namespace
