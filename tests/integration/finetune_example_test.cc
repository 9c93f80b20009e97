// examples:finetune end to end, on its own offline demo (a tiny random Llama it writes, and
// instruction data from the Python standard library's docstrings), against transformers, peft
// and tokenizers (finetune_reference.py):
//   - LoRA, one process: the exported adapter loads in peft onto the base folder, and peft's
//     validation loss (response tokens only) equals the run's own: data rendering, masking,
//     the adapter's names, scaling and values all agree;
//   - LoRA merged on export (finetune.lora.merge_on_export): transformers loads the folder with
//     the same loss;
//   - LoRA on a GPT-2 folder (Conv1D layers in transformers): peft loads the adapter onto
//     GPT2LMHeadModel with the run's loss, transformers the merged export, and the run's greedy
//     sample is transformers' generate's (finetune_sample_reference.py); under tp 2 (and with
//     sequence parallelism) it trains as one process within 1e-5;
//   - full fine-tune under fsdp on 2 processes: the Hugging Face folder loads with the run's loss;
//   - a run stopped after 4 steps and resumed mid-epoch from its checkpoint exports an adapter
//     bitwise equal to the uninterrupted run's (ddp 2), and so does fsdp 2 with fabric.empty_init;
//     one process with it exports the adapter of one process without it, bitwise;
//   - LoRA on every projection under tensor parallelism (model_parallel, tp 2; with and without
//     sequence parallelism; dropout on) trains as one process: losses, the exported adapter
//     (whole: one process's names and shapes) and the merged export (gradients clipped) within
//     1e-5 (the sequence-parallel run under an empty init); a tp 2 run resumed from its sharded
//     checkpoint exports the uninterrupted one's adapter bitwise (within 1e-5 resumed at tp 1);
// and bad input (a template without {response}, LoRA targets matching nothing, data.train
// missing with a model of one's own) stops with one line naming the key.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/types.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "fabric/checkpoint/safetensors.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;
using fabric::testing::run_command;

namespace {

class FinetuneExampleTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string tmpl = (fs::path(::testing::TempDir()) / "finetune_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string python() {
    const char* p = std::getenv("PYTHON");
    return p ? p : "python3";
  }

  // examples/finetune on the demo (its files under the suite's folder), float32, the validation
  // loss over `val` (every batch), no sample; `extra` last. Returns the run's output.
  static fabric::testing::CommandResult finetune(const std::string& extra) {
    return run_command(
        "cd '" + dir_.string() + "' && '" +
        (fs::current_path() / "examples" / "finetune").string() +
        "' fabric.accelerator=cpu fabric.precision=32-true finetune.demo_cache=" +
        (dir_ / "cache").string() + " 'data.template=\"Q: {prompt}\\nA: {response}\"'" +
        " data.block_size=96 data.batch_size=4 trainer.limit_eval_batches=-1" +
        " finetune.sample_tokens=0 finetune.eval_every_n_steps=0" +
        " logging.log_every_n_steps=2 optimizer.lr=1e-2 data.token_cache=tokens " + extra);
  }

  // The JSON summary the run's last line names.
  static nlohmann::json summary(const std::string& out) {
    const size_t at = out.rfind("summary.json");
    if (at == std::string::npos) return nullptr;
    const size_t begin = out.rfind('\n', at) + 1;
    std::ifstream in(out.substr(begin, at + 12 - begin));
    return nlohmann::json::parse(in, nullptr, false);
  }

  static fs::path demo(const char* name) {
    return dir_ / "cache" / ("finetune-demo-" + python_version()) / name;
  }
  static std::string python_version() {
    if (!fs::is_directory(dir_ / "cache")) return "";
    for (const auto& e : fs::directory_iterator(dir_ / "cache"))
      if (e.path().filename().string().rfind("finetune-demo-", 0) == 0)
        return e.path().filename().string().substr(14);
    return "";
  }

  // The reference's loss over the validation file for each folder with its adapter (empty:
  // none), in one Python process (its imports take 10-15 s on 2 vCPUs); NAN where it gave none.
  static std::vector<double> reference_losses(
      const std::vector<std::pair<fs::path, fs::path>>& runs) {
    std::string args;
    for (const auto& [model, adapter] : runs)
      args += " --model=" + model.string() + " --adapter=" + adapter.string();
    const auto r = run_command(python() + " tests/integration/finetune_reference.py loss" + args +
                               " --data=" + (dir_ / "val.jsonl").string() + " '--template=" +
                               "Q: {prompt}\nA: {response}" + "' --block_size=96");
    EXPECT_EQ(r.code, 0) << r.out;
    std::vector<double> losses;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("LOSS ", 0) == 0) losses.push_back(std::stod(line.substr(5)));
    losses.resize(runs.size(), NAN);
    return losses;
  }
  static double reference_loss(const fs::path& model, const fs::path& adapter) {
    return reference_losses({{model, adapter}})[0];
  }

  static fs::path dir_;
};

fs::path FinetuneExampleTest::dir_;

// The validation file: the demo's first 24 validation examples (an even count: two ranks read
// the same examples as one process).
void write_val(const fs::path& from, const fs::path& to) {
  std::ifstream in(from);
  std::ofstream out(to);
  std::string line;
  for (int i = 0; i < 24 && std::getline(in, line); ++i) out << line << "\n";
}

TEST_F(FinetuneExampleTest, LoraAdapterMergedAndFullExportsGiveTransformersTheRunsLoss) {
  // LoRA, one process, 6 steps; the demo is written on the way.
  const auto lora = finetune("fabric.devices=1 trainer.max_steps=6 logging.run_dir=lora");
  ASSERT_EQ(lora.code, 0) << lora.out;
  EXPECT_NE(lora.out.find("model.pretrained is not set: building the demo"), std::string::npos);
  write_val(demo("val.jsonl"), dir_ / "val.jsonl");
  // Again with the short validation file (the demo's own is long): the loss to compare.
  const auto run =
      finetune("fabric.devices=1 trainer.max_steps=6 logging.run_dir=lora2 data.val=" +
               (dir_ / "val.jsonl").string() + " data.train=" + demo("train.jsonl").string());
  ASSERT_EQ(run.code, 0) << run.out;
  EXPECT_NE(run.out.find("(from the token cache)"), std::string::npos) << run.out;
  const auto s = summary(run.out);
  ASSERT_TRUE(s.is_object()) << run.out;
  const double ours = s["val_loss"].get<double>();
  EXPECT_GT(s["trainable_params"].get<int64_t>(), 0);
  EXPECT_LT(s["trainable_params"].get<int64_t>(), s["parameters"].get<int64_t>() / 4);
  const fs::path adapter = dir_ / "lora2" / "export";
  ASSERT_TRUE(fs::exists(adapter / "adapter_model.safetensors")) << run.out;

  // Merged on export: a plain Hugging Face folder with the same loss.
  const auto merged = finetune(
      "fabric.devices=1 trainer.max_steps=6 logging.run_dir=merged "
      "finetune.lora.merge_on_export=true "
      "data.val=" +
      (dir_ / "val.jsonl").string() + " data.train=" + demo("train.jsonl").string());
  ASSERT_EQ(merged.code, 0) << merged.out;
  const double merged_ours = summary(merged.out)["val_loss"].get<double>();

  // Full fine-tune, fsdp over 2 processes: the exported folder.
  const auto full = finetune(
      "fabric.devices=2 fabric.strategy=fsdp finetune.method=full trainer.max_steps=4 "
      "optimizer.lr=1e-3 logging.run_dir=full data.val=" +
      (dir_ / "val.jsonl").string() + " data.train=" + demo("train.jsonl").string());
  ASSERT_EQ(full.code, 0) << full.out;
  const double full_ours = summary(full.out)["val_loss"].get<double>();

  // transformers and peft on the adapter, the untrained base, the merged and the full export.
  const std::vector<double> reference = reference_losses({{demo("model"), adapter},
                                                          {demo("model"), ""},
                                                          {dir_ / "merged" / "export", ""},
                                                          {dir_ / "full" / "export", ""}});
  const double peft = reference[0];
  EXPECT_NEAR(ours, peft, 2e-5 * std::abs(peft)) << "ours " << ours << ", peft " << peft;
  // The untrained base's loss differs: the adapter changed something.
  EXPECT_GT(std::abs(reference[1] - peft), 1e-3);
  EXPECT_NEAR(merged_ours, reference[2], 2e-5 * std::abs(merged_ours));
  EXPECT_NEAR(full_ours, reference[3], 2e-5 * std::abs(full_ours));
}

TEST_F(FinetuneExampleTest, AResumedRunExportsTheUninterruptedRunsAdapterBitwise) {
  const std::string common =
      "fabric.devices=2 fabric.strategy=ddp trainer.max_steps=8 "
      "checkpoint.every_n_steps=4 trainer.limit_eval_batches=1 "
      "finetune.lora.dropout=0.1 ";
  const auto whole = finetune(common + "logging.run_dir=whole");
  ASSERT_EQ(whole.code, 0) << whole.out;
  const auto first = finetune(common + "logging.run_dir=cut trainer.max_steps=4");
  ASSERT_EQ(first.code, 0) << first.out;
  const auto resumed = finetune(common + "logging.run_dir=resumed checkpoint.resume=" +
                                (dir_ / "cut" / "checkpoints" / "step-00000004.ckpt").string());
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("at step 4"), std::string::npos) << resumed.out;
  // The checkpoint holds the adapters, not the frozen base: smaller than the base's weights.
  const auto ckpt = fs::file_size(dir_ / "cut" / "checkpoints" / "step-00000004.ckpt");
  EXPECT_LT(ckpt, fs::file_size(demo("model") / "model.safetensors") / 2) << ckpt;
  const auto same = run_command(python() + " tests/integration/finetune_reference.py same " +
                                (dir_ / "whole/export/adapter_model.safetensors").string() + " " +
                                (dir_ / "resumed/export/adapter_model.safetensors").string());
  EXPECT_EQ(same.code, 0) << same.out;
  // fsdp with an empty init (the base and the adapters built on the meta device, the adapters'
  // values given by setup, the base loaded after it): the ddp run's adapter, bitwise.
  const auto empty = finetune(common + "fabric.strategy=fsdp fabric.empty_init=true " +
                              "logging.run_dir=whole_fsdp_empty");
  ASSERT_EQ(empty.code, 0) << empty.out;
  const auto same_empty =
      run_command(python() + " tests/integration/finetune_reference.py same " +
                  (dir_ / "whole/export/adapter_model.safetensors").string() + " " +
                  (dir_ / "whole_fsdp_empty/export/adapter_model.safetensors").string());
  EXPECT_EQ(same_empty.code, 0) << same_empty.out;
}

// The bytes a checkpoint takes on disk (a sharded checkpoint is a folder of files).
uintmax_t checkpoint_bytes(const fs::path& path) {
  if (!fs::is_directory(path)) return fs::file_size(path);
  uintmax_t bytes = 0;
  for (const auto& e : fs::recursive_directory_iterator(path))
    if (e.is_regular_file()) bytes += e.file_size();
  return bytes;
}

// The largest difference between two safetensors files' tensors of the same names and shapes
// (a failure for a name or shape one of them lacks); `largest`: the first file's largest value.
double max_difference(const fs::path& a, const fs::path& b, double* largest = nullptr) {
  const auto x = fabric::load_safetensors(a).tensors, y = fabric::load_safetensors(b).tensors;
  EXPECT_EQ(x.size(), y.size()) << a << " vs " << b;
  double diff = 0, top = 0;
  for (const auto& [name, t] : x) {
    const auto it =
        std::find_if(y.begin(), y.end(), [&](const auto& e) { return e.first == name; });
    if (it == y.end()) {
      ADD_FAILURE() << name << " is in " << a << ", not in " << b;
      continue;
    }
    EXPECT_EQ(t.sizes(), it->second.sizes()) << name;
    if (!t.sizes().equals(it->second.sizes())) continue;
    diff = std::max(
        diff, (t.to(torch::kDouble) - it->second.to(torch::kDouble)).abs().max().item<double>());
    top = std::max(top, t.abs().max().item<double>());
  }
  if (largest != nullptr) *largest = top;
  return diff;
}

// Adapter-only checkpoints under fsdp (issue 70): a LoRA run's sharded checkpoint holds each
// rank's pieces of the adapters, the optimizer, scheduler and loader, not the frozen base (a small
// fraction of the base's bytes); resumed mid-epoch it exports the uninterrupted run's adapter
// bitwise, and resumed under ddp (the adapters named alike) within 1e-6.
TEST_F(FinetuneExampleTest, FsdpLoraCheckpointsHoldTheAdaptersAndResumeUnderDdp) {
  const std::string common =
      "fabric.devices=2 fabric.strategy=fsdp trainer.max_steps=8 "
      "checkpoint.every_n_steps=4 trainer.limit_eval_batches=1 "
      "finetune.lora.dropout=0.1 ";
  const auto whole = finetune(common + "logging.run_dir=fsdp_whole");
  ASSERT_EQ(whole.code, 0) << whole.out;
  const auto cut = finetune(common + "logging.run_dir=fsdp_cut trainer.max_steps=4");
  ASSERT_EQ(cut.code, 0) << cut.out;
  const fs::path ckpt = dir_ / "fsdp_cut" / "checkpoints" / "step-00000004.ckpt";
  EXPECT_TRUE(fs::is_directory(ckpt)) << "not sharded: " << ckpt;
  const auto bytes = checkpoint_bytes(ckpt);
  const auto base = fs::file_size(demo("model") / "model.safetensors");
  EXPECT_LT(bytes, base / 5) << bytes << " bytes, the base " << base;
  std::cout << "fsdp 2 LoRA checkpoint: " << bytes << " bytes, the base " << base << std::endl;
  const fs::path adapter = dir_ / "fsdp_whole" / "export" / "adapter_model.safetensors";
  const auto resumed =
      finetune(common + "logging.run_dir=fsdp_resumed checkpoint.resume=" + ckpt.string());
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("at step 4"), std::string::npos) << resumed.out;
  EXPECT_EQ(max_difference(adapter, dir_ / "fsdp_resumed" / "export" / "adapter_model.safetensors"),
            0.0);
  const auto ddp = finetune(common + "fabric.strategy=ddp logging.run_dir=fsdp_to_ddp " +
                            "checkpoint.resume=" + ckpt.string());
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  EXPECT_NE(ddp.out.find("at step 4"), std::string::npos) << ddp.out;
  const double diff =
      max_difference(adapter, dir_ / "fsdp_to_ddp" / "export" / "adapter_model.safetensors");
  EXPECT_LE(diff, 1e-6);
  std::cout << "fsdp -> ddp resume: largest difference " << diff << std::endl;
}

// "tp 2 LoRA equal one process" (issue 70): adapters on the column layers (q, k, v, gate, up:
// A whole, B by rows) and the row layers (o, down: A by columns, B whole), dropout 0.1, plain SGD
// (the reduction orders differ), 6 steps.
TEST_F(FinetuneExampleTest, TensorParallelLoraTrainsAsOneProcess) {
  const std::string common =
      "trainer.max_steps=6 trainer.limit_eval_batches=4 optimizer.name=sgd optimizer.lr=0.1 "
      "finetune.lora.dropout=0.1 fabric.seed=3 "
      "'finetune.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]' ";
  const std::string tp =
      "fabric.devices=2 fabric.strategy=model_parallel "
      "fabric.model_parallel.tensor_parallel_size=2 ";
  const auto one = finetune(common + "fabric.devices=1 logging.run_dir=tp_one");
  ASSERT_EQ(one.code, 0) << one.out;
  const auto split = finetune(common + tp + "logging.run_dir=tp_two");
  ASSERT_EQ(split.code, 0) << split.out;
  EXPECT_NE(split.out.find("modules split over tp"), std::string::npos) << split.out;
  // With sequence parallelism, and an empty init (the adapters recorded with the base).
  const auto seq = finetune(common + tp +
                            "fabric.model_parallel.sequence_parallel=true fabric.empty_init=true "
                            "logging.run_dir=tp_sp");
  ASSERT_EQ(seq.code, 0) << seq.out;
  const auto s1 = summary(one.out);
  ASSERT_TRUE(s1.is_object()) << one.out;
  // One process with an empty init: the same adapters (A drawn as without it), bitwise.
  const auto empty = finetune(common + "fabric.devices=1 fabric.empty_init=true " +
                              "logging.run_dir=tp_one_empty");
  ASSERT_EQ(empty.code, 0) << empty.out;
  const auto se = summary(empty.out);
  ASSERT_TRUE(se.is_object()) << empty.out;
  for (const char* key : {"train_loss", "val_loss"}) EXPECT_EQ(se[key], s1[key]) << key;
  EXPECT_EQ(max_difference(dir_ / "tp_one" / "export" / "adapter_model.safetensors",
                           dir_ / "tp_one_empty" / "export" / "adapter_model.safetensors"),
            0.0);
  for (const auto* run : {&split, &seq}) {
    const auto s = summary(run->out);
    ASSERT_TRUE(s.is_object()) << run->out;
    for (const char* key : {"train_loss", "val_loss"})
      EXPECT_NEAR(s[key].get<double>(), s1[key].get<double>(), 1e-5) << key << "\n" << run->out;
    EXPECT_EQ(s["trainable_params"], s1["trainable_params"]);
  }
  // The exported adapters: whole (every name and shape of one process's; 2 layers x 7 x A, B),
  // trained (B moved off its zeros) and equal.
  const fs::path adapter = dir_ / "tp_one" / "export" / "adapter_model.safetensors";
  EXPECT_EQ(fabric::load_safetensors(adapter).tensors.size(), 28u);
  for (const char* run : {"tp_two", "tp_sp"}) {
    double largest = 0;
    EXPECT_LE(
        max_difference(adapter, dir_ / run / "export" / "adapter_model.safetensors", &largest),
        1e-5)
        << run;
    EXPECT_GT(largest, 1e-2) << run;
  }
  // merge_on_export: the merged model gathered from tp 2 is one process's merged model; with
  // gradient clipping (active at 0.05: the norm counts the cut adapter tensors once, the whole
  // ones once per tp group).
  const std::string merged = "finetune.lora.merge_on_export=true trainer.gradient_clip_val=0.05 ";
  const auto merged_one = finetune(common + merged + "fabric.devices=1 logging.run_dir=tp_one_m");
  ASSERT_EQ(merged_one.code, 0) << merged_one.out;
  const auto clipped = summary(merged_one.out);
  ASSERT_TRUE(clipped.is_object()) << merged_one.out;
  EXPECT_GT(std::abs(clipped["val_loss"].get<double>() - s1["val_loss"].get<double>()), 1e-3);
  const auto merged_two = finetune(common + tp + merged + "logging.run_dir=tp_two_m");
  ASSERT_EQ(merged_two.code, 0) << merged_two.out;
  EXPECT_LE(max_difference(dir_ / "tp_one_m" / "export" / "model.safetensors",
                           dir_ / "tp_two_m" / "export" / "model.safetensors"),
            1e-5);
  EXPECT_GT(max_difference(demo("model") / "model.safetensors",
                           dir_ / "tp_two_m" / "export" / "model.safetensors"),
            1e-4);  // the adapters are in it
  // A sharded checkpoint (each rank's slices of the cut adapters) resumes bitwise, and at tp 1.
  const std::string checkpoint = (dir_ / "tp_cut" / "checkpoints" / "step-00000003.ckpt").string();
  const auto cut = finetune(
      common + tp + "trainer.max_steps=3 checkpoint.every_n_steps=3 logging.run_dir=tp_cut");
  ASSERT_EQ(cut.code, 0) << cut.out;
  // The adapters' slices, the optimizer, scheduler and loader, not the frozen base: adapters on
  // all seven projections are 15 % of this model's parameters, SGD's momentum as many again
  // (measured 218 KB against the base's 440 KB; with the whole model's pieces about 590 KB).
  const auto bytes = checkpoint_bytes(checkpoint);
  EXPECT_LT(bytes, fs::file_size(demo("model") / "model.safetensors") * 3 / 5) << bytes;
  std::cout << "tp 2 LoRA checkpoint: " << bytes << " bytes" << std::endl;
  const auto resumed =
      finetune(common + tp + "logging.run_dir=tp_resumed checkpoint.resume=" + checkpoint);
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("at step 3"), std::string::npos) << resumed.out;
  EXPECT_EQ(max_difference(dir_ / "tp_two" / "export" / "adapter_model.safetensors",
                           dir_ / "tp_resumed" / "export" / "adapter_model.safetensors"),
            0.0);
  const auto at_one = finetune(common +
                               "fabric.devices=1 fabric.strategy=model_parallel "
                               "fabric.model_parallel.tensor_parallel_size=1 "
                               "logging.run_dir=tp_resumed_1 checkpoint.resume=" +
                               checkpoint);
  ASSERT_EQ(at_one.code, 0) << at_one.out;
  EXPECT_NE(at_one.out.find("at step 3"), std::string::npos) << at_one.out;
  EXPECT_LE(max_difference(dir_ / "tp_two" / "export" / "adapter_model.safetensors",
                           dir_ / "tp_resumed_1" / "export" / "adapter_model.safetensors"),
            1e-5);
}

// A GPT-2 folder (tests/integration/pretrained_models.py's, tokenizer trained on the demo's data):
// LoRA on c_attn, c_proj and c_fc (Conv1D layers in transformers), 4 steps; the exported adapter
// (fan_in_fan_out true: a warning of peft's fails the reference) loads in peft onto
// GPT2LMHeadModel with the run's validation loss, and so does the merged export in transformers.
// The run's greedy answer to finetune.sample_prompt is transformers' generate's with that adapter.
TEST_F(FinetuneExampleTest, Gpt2LoraAdapterGivesPeftTheRunsLoss) {
  if (!fs::exists(demo("train.jsonl"))) {  // this test alone: the demo's data first
    const auto r = finetune("fabric.devices=1 trainer.max_steps=1 logging.run_dir=demo_only");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  if (!fs::exists(dir_ / "val.jsonl")) write_val(demo("val.jsonl"), dir_ / "val.jsonl");
  const auto made = run_command(python() + " tests/integration/pretrained_models.py make " +
                                (dir_ / "hf").string() + " " + demo("train.jsonl").string());
  ASSERT_EQ(made.code, 0) << made.out;
  const std::string prompt = "What does join do in posixpath?";
  const auto run = finetune("fabric.devices=1 trainer.max_steps=4 logging.run_dir=gpt2 " +
                            std::string("model.pretrained=") + (dir_ / "hf" / "gpt2").string() +
                            " data.train=" + demo("train.jsonl").string() +
                            " data.val=" + (dir_ / "val.jsonl").string() +
                            " 'finetune.lora.target_modules=[c_attn,c_proj,c_fc]'" +
                            " finetune.sample_tokens=12 'finetune.sample_prompt=" + prompt + "'");
  ASSERT_EQ(run.code, 0) << run.out;
  const auto s = summary(run.out);
  ASSERT_TRUE(s.is_object()) << run.out;
  const double ours = s["val_loss"].get<double>();
  const fs::path adapter = dir_ / "gpt2" / "export";
  std::ifstream config(adapter / "adapter_config.json");
  EXPECT_TRUE(nlohmann::json::parse(config, nullptr, false).value("fan_in_fan_out", false));
  // The sample: transformers' greedy ids after the template's prompt part, decoded as ours.
  EXPECT_FALSE(s["sample"].get<std::string>().empty()) << run.out;
  const auto answer = run_command(
      python() + " tests/integration/finetune_sample_reference.py --model=" +
      (dir_ / "hf" / "gpt2").string() + " --adapter=" + adapter.string() + " '--prompt=" + prompt +
      "' '--template=Q: {prompt}\nA: {response}' --max_new_tokens=12 --summary=" +
      (dir_ / "gpt2" / "summary.json").string());
  EXPECT_EQ(answer.code, 0) << answer.out;
  // Merged on export: the adapters folded into our [out, in] weights, written back as Conv1D's
  // [in, out]; transformers loads the GPT-2 folder with the run's loss.
  const auto merged = finetune(
      "fabric.devices=1 trainer.max_steps=4 logging.run_dir=gpt2_merged "
      "finetune.lora.merge_on_export=true 'finetune.lora.target_modules=[c_attn,c_proj,c_fc]' "
      "model.pretrained=" +
      (dir_ / "hf" / "gpt2").string() + " data.train=" + demo("train.jsonl").string() +
      " data.val=" + (dir_ / "val.jsonl").string());
  ASSERT_EQ(merged.code, 0) << merged.out;
  const double merged_ours = summary(merged.out)["val_loss"].get<double>();
  // peft on the adapter, the untrained base, transformers on the merged export.
  const std::vector<double> reference = reference_losses({{dir_ / "hf" / "gpt2", adapter},
                                                          {dir_ / "hf" / "gpt2", ""},
                                                          {dir_ / "gpt2_merged" / "export", ""}});
  const double peft = reference[0];
  EXPECT_NEAR(ours, peft, 2e-5 * std::abs(peft)) << "ours " << ours << ", peft " << peft;
  EXPECT_GT(std::abs(reference[1] - peft), 1e-3);
  EXPECT_NEAR(merged_ours, reference[2], 2e-5 * std::abs(merged_ours));
}

// GPT-2 LoRA under tensor parallelism (issue 70): c_attn is column(3) (q, k and v each split by
// heads: lora_B cut by each part's rows), the c_proj layers row (lora_A cut by columns), c_fc
// column. tp 2, and tp 2 with sequence parallelism under an empty init (the adapters recorded
// with the base), train as one process (float32, SGD, dropout 0.1, 6 steps): losses and the
// exported adapters within 1e-5, and peft loads the tp run's adapter with its validation loss.
TEST_F(FinetuneExampleTest, Gpt2TensorParallelLoraTrainsAsOneProcess) {
  if (!fs::exists(demo("train.jsonl"))) {  // this test alone: the demo's data first
    const auto r = finetune("fabric.devices=1 trainer.max_steps=1 logging.run_dir=demo_only");
    ASSERT_EQ(r.code, 0) << r.out;
  }
  if (!fs::exists(dir_ / "val.jsonl")) write_val(demo("val.jsonl"), dir_ / "val.jsonl");
  const fs::path gpt2 = dir_ / "hf" / "gpt2";
  if (!fs::exists(gpt2 / "config.json")) {  // else Gpt2LoraAdapterGivesPeftTheRunsLoss's folder
    const auto made = run_command(python() + " tests/integration/pretrained_models.py make " +
                                  (dir_ / "hf").string() + " " + demo("train.jsonl").string());
    ASSERT_EQ(made.code, 0) << made.out;
  }
  const std::string common =
      "trainer.max_steps=6 optimizer.name=sgd optimizer.lr=0.1 finetune.lora.dropout=0.1 "
      "fabric.seed=3 'finetune.lora.target_modules=[c_attn,c_proj,c_fc]' model.pretrained=" +
      gpt2.string() + " data.train=" + demo("train.jsonl").string() +
      " data.val=" + (dir_ / "val.jsonl").string() + " ";
  const std::string tp =
      "fabric.devices=2 fabric.strategy=model_parallel "
      "fabric.model_parallel.tensor_parallel_size=2 ";
  const auto one = finetune(common + "fabric.devices=1 logging.run_dir=gpt2_tp_one");
  ASSERT_EQ(one.code, 0) << one.out;
  const auto split = finetune(common + tp + "logging.run_dir=gpt2_tp_two");
  ASSERT_EQ(split.code, 0) << split.out;
  EXPECT_NE(split.out.find("modules split over tp"), std::string::npos) << split.out;
  const auto seq = finetune(common + tp +
                            "fabric.model_parallel.sequence_parallel=true fabric.empty_init=true "
                            "logging.run_dir=gpt2_tp_sp");
  ASSERT_EQ(seq.code, 0) << seq.out;
  const auto s1 = summary(one.out);
  ASSERT_TRUE(s1.is_object()) << one.out;
  for (const auto* run : {&split, &seq}) {
    const auto s = summary(run->out);
    ASSERT_TRUE(s.is_object()) << run->out;
    for (const char* key : {"train_loss", "val_loss"})
      EXPECT_NEAR(s[key].get<double>(), s1[key].get<double>(), 1e-5) << key << "\n" << run->out;
    EXPECT_EQ(s["trainable_params"], s1["trainable_params"]);
  }
  // Whole adapters (2 blocks x c_attn, attn.c_proj, c_fc, mlp.c_proj x A, B), trained, equal.
  const fs::path adapter = dir_ / "gpt2_tp_one" / "export" / "adapter_model.safetensors";
  EXPECT_EQ(fabric::load_safetensors(adapter).tensors.size(), 16u);
  for (const char* run : {"gpt2_tp_two", "gpt2_tp_sp"}) {
    double largest = 0;
    const double diff =
        max_difference(adapter, dir_ / run / "export" / "adapter_model.safetensors", &largest);
    EXPECT_LE(diff, 1e-5) << run;
    EXPECT_GT(largest, 1e-2) << run;
    std::cout << run << ": the adapter within " << diff << " of one process's" << std::endl;
  }
  const double ours = summary(split.out)["val_loss"].get<double>();
  const double peft = reference_loss(gpt2, dir_ / "gpt2_tp_two" / "export");
  EXPECT_NEAR(ours, peft, 2e-5 * std::abs(peft)) << "ours " << ours << ", peft " << peft;
}

// The validation loss reaches the callbacks: early stopping (min_delta 10 is never met, patience
// 1) ends the run at the second evaluation, step 2 of 20.
TEST_F(FinetuneExampleTest, EarlyStoppingActsOnTheValidationLoss) {
  const auto r = finetune(
      "fabric.devices=1 trainer.max_steps=20 finetune.eval_every_n_steps=1 "
      "trainer.limit_eval_batches=1 callbacks.early_stopping.monitor=val/loss "
      "callbacks.early_stopping.patience=1 callbacks.early_stopping.min_delta=10 "
      "logging.run_dir=early");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto s = summary(r.out);
  ASSERT_TRUE(s.is_object()) << r.out;
  EXPECT_EQ(s["steps"].get<int64_t>(), 2) << r.out;
  EXPECT_TRUE(s["stopped_early"].is_string()) << r.out;
  // Without evaluations during training nothing could stop it: refused before training.
  const auto refused =
      finetune("fabric.devices=1 trainer.max_steps=2 callbacks.early_stopping.monitor=val/loss");
  EXPECT_EQ(refused.code, 2) << refused.out;
  EXPECT_NE(refused.out.find("finetune.eval_every_n_steps"), std::string::npos) << refused.out;
}

// The sample answer stops at the model's last position (the demo Llama's 512) instead of failing
// after the run has trained; a prompt that fills them all is said, and the run still exports.
TEST_F(FinetuneExampleTest, ASampleLongerThanThePositionsStopsAtTheLast) {
  const auto r = finetune(
      "fabric.devices=1 trainer.max_steps=1 logging.run_dir=long_sample "
      "'finetune.sample_prompt=What does join do?' finetune.sample_tokens=100000");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sample (finetune.sample_prompt): "), std::string::npos) << r.out;
  std::string words;
  for (int i = 0; i < 600; ++i) words += " join";
  const auto full = finetune(
      "fabric.devices=1 trainer.max_steps=1 logging.run_dir=full_sample "
      "'finetune.sample_prompt=" +
      words + "' finetune.sample_tokens=8");
  ASSERT_EQ(full.code, 0) << full.out;
  EXPECT_NE(full.out.find("ids fill the model's 512 positions)"), std::string::npos) << full.out;
  EXPECT_NE(full.out.find("exported "), std::string::npos) << full.out;
}

// data.template chat_template (the demo folder's ChatML chat template, rendered by
// fabric/data/jinja.h) trains as the built-in chatml: the same examples and response tokens, the
// same validation loss after 2 steps, and the same greedy answer to finetune.sample_prompt (one
// user message and the template's generation prompt).
TEST_F(FinetuneExampleTest, TheFoldersChatTemplateTrainsAsChatml) {
  std::string data[2];
  nlohmann::json s[2];
  const std::string tmpls[] = {"chatml", "chat_template"};
  for (int k = 0; k < 2; ++k) {
    const auto r =
        finetune("fabric.devices=1 trainer.max_steps=2 trainer.limit_eval_batches=2 " +
                 std::string("logging.run_dir=chat_") + tmpls[k] + " data.template=" + tmpls[k] +
                 " finetune.sample_tokens=6 'finetune.sample_prompt=What does join do?'");
    ASSERT_EQ(r.code, 0) << r.out;
    const size_t end = r.out.find(" response tokens");
    ASSERT_NE(end, std::string::npos) << r.out;
    const size_t begin = r.out.rfind("data: ", end);
    data[k] = r.out.substr(begin, end - begin);
    s[k] = summary(r.out);
    ASSERT_TRUE(s[k].is_object()) << r.out;
  }
  EXPECT_EQ(data[0], data[1]);
  EXPECT_EQ(s[0]["val_loss"].get<double>(), s[1]["val_loss"].get<double>());
  EXPECT_FALSE(s[1]["sample"].get<std::string>().empty());
  EXPECT_EQ(s[0]["sample"], s[1]["sample"]);
  // A folder's chat_template.jinja (as transformers 4.43+ saves one) comes before
  // tokenizer_config.json's (here: a turn ending in two newlines, one more response token per
  // example), and the merged export keeps it.
  const fs::path folder = dir_ / "jinja_model";
  fs::remove_all(folder);
  fs::copy(demo("model"), folder);
  const std::string jinja =
      "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  std::ofstream(folder / "chat_template.jinja") << jinja;
  const auto r = finetune(
      "fabric.devices=1 trainer.max_steps=1 trainer.limit_eval_batches=1 "
      "logging.run_dir=chat_jinja data.template=chat_template "
      "finetune.lora.merge_on_export=true model.pretrained=" +
      folder.string() + " data.train=" + demo("train.jsonl").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t end = r.out.find(" response tokens");
  ASSERT_NE(end, std::string::npos) << r.out;
  EXPECT_NE(r.out.substr(r.out.rfind("data: ", end), end - r.out.rfind("data: ", end)), data[0]);
  std::ifstream exported(dir_ / "chat_jinja" / "export" / "chat_template.jinja");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(exported), {}), jinja);
}

TEST_F(FinetuneExampleTest, BadInputStopsWithOneLineNamingTheKey) {
  struct Case {
    std::string args, key, fix;
  };
  std::ofstream(dir_ / "one.jsonl") << "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  std::ofstream(dir_ / "garbled.jsonl") << "{\"prompt\": \"a\", \"response\": \"b\"}\nnope\n";
  std::ofstream(dir_ / "sys.jsonl") << R"({"messages": [{"role": "system", "content": "s"}, )"
                                    << R"({"role": "user", "content": "u"}, )"
                                    << R"({"role": "assistant", "content": "a"}]})"
                                    << "\n";
  std::ofstream(dir_ / "needsys.jinja")
      << "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') "
         "}}{% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant: {% endif %}";
  // A model folder another program wrote (its weights carry no export mark): never replaced.
  const fs::path theirs = dir_ / "theirs";
  fs::create_directories(theirs);
  std::ofstream(theirs / "config.json") << "{}";
  fabric::save_safetensors(theirs / "model.safetensors", {{"w", torch::ones({2})}},
                           {{"format", "pt"}});
  const Case cases[] = {
      {"'data.template=\"Q: {prompt}\"'", "data.template", "Q: {prompt}\\nA: {response}"},
      // A prompt placed where the loss is taken would be learned as the answer.
      {"'data.template=\"A: {response} Q: {prompt}\"'", "data.template",
       "put it before {response}"},
      {"data.template=chat/none.jinja", "data.template: " + (dir_ / "chat/none.jinja").string(),
       "cannot read this chat template file"},
      // A sample prompt the template refuses stops the run before training, not after it.
      {"data.template=needsys.jinja data.train=" + (dir_ / "sys.jsonl").string() +
           " finetune.sample_prompt=Hello",
       "finetune.sample_prompt: " + (dir_ / "needsys.jinja").string() +
           ": line 1: the template raised: first message must be system",
       "the template raised"},
      {"finetune.lora.rank=100000", "finetune.lora.rank: LoRA: rank 100000 is larger than",
       "min(in, out)"},
      // No full batch: no step would run and the untrained base would be exported.
      {"data.train=" + (dir_ / "one.jsonl").string() + " data.drop_last=true data.batch_size=4",
       "data.drop_last", "set data.drop_last=false or lower data.batch_size"},
      {"finetune.lora.target_modules=[qq_proj]", "qq_proj", "q_proj"},
      // Stages and sequence splits the loop never makes: every rank would run everything.
      {"fabric.strategy=model_parallel fabric.model_parallel.context_parallel_size=2",
       "fabric.model_parallel.context_parallel_size: 2: examples:finetune runs neither",
       "train with examples:gpt"},
      {"model.pretrained=" + (dir_ / "cache").string(), "model.pretrained", "config.json"},
      {"model.pretrained=" + demo("model").string(), "data.train", "JSONL"},
      // An export into the base folder would mix with its weights (Checkpointer's input check).
      {"model.pretrained=" + demo("model").string() + " data.train=" +
           demo("train.jsonl").string() + " checkpoint.export_weights=" + demo("model").string(),
       "checkpoint.export_weights", "model.pretrained"},
      {"data.train=" + dir_.string(), "data.train: " + dir_.string() + ": is a folder",
       "give a JSONL file"},
      {"data.val=" + (dir_ / "garbled.jsonl").string(),
       "data.val: " + (dir_ / "garbled.jsonl").string() + ":2: not JSON (column 2", "a line is {"},
      {"checkpoint.export_weights=" + theirs.string() + " finetune.lora.merge_on_export=true",
       "checkpoint.export_weights: " + theirs.string() +
           ": holds a model this project did not export",
       "choose a new or empty folder as checkpoint.export_weights"},
  };
  for (const Case& k : cases) {
    const auto r = finetune("fabric.devices=1 trainer.max_steps=1 " + k.args);
    EXPECT_EQ(r.code, 2) << k.args << "\n" << r.out;  // bad input (fabric/main.h)
    EXPECT_NE(r.out.find(k.key), std::string::npos) << k.args << "\n" << r.out;
    EXPECT_NE(r.out.find(k.fix), std::string::npos) << k.args << "\n" << r.out;
  }
  EXPECT_EQ(fabric::load_safetensors(theirs / "model.safetensors").tensors.size(), 1u);
}

// finetune.lora.base_dtype (issue 70): LoRA trains on a frozen base kept in bf16 or float8
// (3 steps each), the adapter exports as with auto and peft loads it onto the float32 base folder
// with a validation loss within 1e-5 (bf16) or 1e-4 (fp8, relative) of the run's own (the run
// computes with the stored base's rounding, peft with the folder's weights); a bad value and a full
// fine-tune with it are refused at the key.
TEST_F(FinetuneExampleTest, LoraOnABf16OrFp8BaseExportsAnAdapterPeftLoads) {
  if (!fs::exists(dir_ / "val.jsonl")) {  // run alone: the demo first
    const auto first = finetune(
        "fabric.devices=1 trainer.max_steps=1 trainer.limit_eval_batches=1 "
        "logging.run_dir=base_demo");
    ASSERT_EQ(first.code, 0) << first.out;
    write_val(demo("val.jsonl"), dir_ / "val.jsonl");
  }
  const std::vector<std::string> dtypes = {"bf16", "fp8"};
  std::vector<double> ours;
  for (const std::string& dtype : dtypes) {
    const auto r = finetune("fabric.devices=1 trainer.max_steps=3 logging.run_dir=base_" + dtype +
                            " finetune.lora.base_dtype=" + dtype +
                            " data.val=" + (dir_ / "val.jsonl").string() +
                            " data.train=" + demo("train.jsonl").string());
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("adapted layers kept as " + dtype), std::string::npos) << r.out;
    const auto s = summary(r.out);
    ASSERT_TRUE(s.is_object()) << r.out;
    ours.push_back(s["val_loss"].get<double>());
  }
  const std::vector<double> peft =
      reference_losses({{demo("model"), dir_ / "base_bf16" / "export"},
                        {demo("model"), dir_ / "base_fp8" / "export"}});
  for (size_t i = 0; i < dtypes.size(); ++i) {
    // Measured (2026-11-29): bf16 2.0e-6, fp8 2.8e-5 relative; the bounds 5x and 3.6x.
    const double bound = dtypes[i] == "bf16" ? 1e-5 : 1e-4;
    EXPECT_NEAR(ours[i], peft[i], bound * std::abs(peft[i]))
        << dtypes[i] << ": ours " << ours[i] << ", peft " << peft[i];
    std::cout << std::setprecision(10) << dtypes[i] << ": val loss " << ours[i]
              << ", peft on the float32 base " << peft[i] << ", relative "
              << std::abs(ours[i] - peft[i]) / std::abs(peft[i]) << std::endl;
  }
  const auto bad = finetune("fabric.devices=1 trainer.max_steps=1 finetune.lora.base_dtype=fp16");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("finetune.lora.base_dtype"), std::string::npos) << bad.out;
  const auto full = finetune(
      "fabric.devices=1 trainer.max_steps=1 finetune.method=full finetune.lora.base_dtype=bf16");
  EXPECT_EQ(full.code, 2) << full.out;
  EXPECT_NE(full.out.find("finetune.lora.base_dtype: 'bf16' stores a LoRA run's frozen base"),
            std::string::npos)
      << full.out;
}

}  // namespace
