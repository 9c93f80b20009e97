// The examples with the tools around training: weights as .safetensors and model.init_weights,
// callbacks (early stopping across ranks and a resume), the profiler, //tools:ckpt on a
// sharded checkpoint, data.batch_size: auto, and //tools:estimate_memory against runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "fabric/checkpoint/safetensors.h"
#include "tests/integration/examples_fixture.h"

namespace fs = std::filesystem;

namespace fabric::testing {
namespace {

// checkpoint.export_format: safetensors writes weights.safetensors; model.init_weights starts a
// run from it: with a learning rate of 1e-30 (each update below a float's resolution) its
// parameters end as they began, the file's, not the seed's initialisation.
TEST_F(ExamplesTest, Cifar10ExportsSafetensorsAndStartsFromThem) {
  const std::string args = std::string("--config=single_cpu.yaml") + kTinyCifar +
                           " trainer.max_steps=2 checkpoint.export_format=safetensors";
  Result first = run("cifar10", args + " logging.run_dir=first");
  ASSERT_EQ(first.code, 0) << first.out;
  const fs::path exported = dir_ / "first" / "weights.safetensors";
  ASSERT_TRUE(fs::exists(exported)) << first.out;
  Result second = run("cifar10", args +
                                     " logging.run_dir=second optimizer.lr=1e-30 "
                                     "optimizer.weight_decay=0 model.init_weights=" +
                                     exported.string());
  ASSERT_EQ(second.code, 0) << second.out;
  const auto a = fabric::load_safetensors(exported);
  const auto b = fabric::load_safetensors(dir_ / "second" / "weights.safetensors");
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  int compared = 0;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto& [name, t] = a.tensors[i];
    ASSERT_EQ(name, b.tensors[i].first);
    if (name.find("running_") != std::string::npos || name.find("num_batches") != std::string::npos)
      continue;  // BatchNorm statistics move in every forward, whatever the learning rate
    EXPECT_TRUE(t.equal(b.tensors[i].second)) << name;
    ++compared;
  }
  EXPECT_GT(compared, 20);

  Result missing = run("cifar10", args + " model.init_weights=" + (dir_ / "none.pt").string());
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("model.init_weights: " + (dir_ / "none.pt").string() +
                             ": cannot open (No such file or directory)"),
            std::string::npos)
      << missing.out;
  Result clash = run("cifar10", args +
                                    " checkpoint.export_weights=w.pt checkpoint.export_format=pt "
                                    "checkpoint.export_weights=w.safetensors");
  EXPECT_EQ(clash.code, 2) << clash.out;
  EXPECT_NE(clash.out.find("w.safetensors ends in .safetensors while checkpoint.export_format is "
                           "pt; set checkpoint.export_format: safetensors"),
            std::string::npos)
      << clash.out;
}

// callbacks.early_stopping: accuracy cannot rise by min_delta 0.5 after the first evaluation, so
// patience 2 stops the run after epoch 3 of 10 on both ranks. A run stopped after epoch 2 and
// resumed stops after epoch 3 too: the callback's state came back (afresh it would wait until
// epoch 5).
TEST_F(ExamplesTest, Cifar10EarlyStoppingStopsEveryRankAndResumesItsPatience) {
  const std::string args = std::string("--config=single_cpu.yaml") + kTinyCifar +
                           " trainer.max_steps=-1 data.synthetic_train_size=64 "
                           "callbacks.early_stopping.monitor=test/accuracy "
                           "callbacks.early_stopping.patience=2 "
                           "callbacks.early_stopping.min_delta=0.5 checkpoint.export_weights=none";
  Result whole = run("cifar10", args +
                                    " trainer.max_epochs=10 fabric.devices=2 "
                                    "logging.run_dir=whole");
  ASSERT_EQ(whole.code, 0) << whole.out;
  auto s = summary_of(whole);
  EXPECT_EQ(s["epochs"], 3);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_NE(s["stopped_early"].get<std::string>().find(
                "test/accuracy did not rise by more than 0.5 in 2 evaluations (best "),
            std::string::npos)
      << whole.out;

  Result first = run("cifar10", args + " trainer.max_epochs=2 logging.run_dir=resumed");
  ASSERT_EQ(first.code, 0) << first.out;
  EXPECT_TRUE(summary_of(first)["stopped_early"].is_null());
  Result second = run("cifar10", args +
                                     " trainer.max_epochs=10 logging.run_dir=resumed "
                                     "checkpoint.resume=auto");
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_EQ(summary_of(second)["epochs"], 3) << second.out;
  EXPECT_FALSE(summary_of(second)["stopped_early"].is_null());
}

// profiler.enabled: each of 2 ranks writes the trace of steps 3-4 into the run directory, and
// rank 0 prints its top ops.
TEST_F(ExamplesTest, Cifar10ProfilerWritesATracePerRankAndATable) {
  Result r = run("cifar10", std::string("--config=single_cpu.yaml") + kTinyCifar +
                                " trainer.max_steps=5 fabric.devices=2 profiler.enabled=true"
                                " profiler.active=2 logging.run_dir=run");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* rank : {"0", "1"}) {
    const fs::path trace =
        dir_ / "run" / "profiler" / (std::string("rank_") + rank + "_step_4.pt.trace.json");
    ASSERT_TRUE(fs::exists(trace)) << r.out;
    const auto j = nlohmann::json::parse(bytes(trace));
    EXPECT_GT(j.at("traceEvents").size(), 10u);
  }
  EXPECT_NE(r.out.find("profiler: 1 trace(s) per rank in " + (dir_ / "run" / "profiler").string()),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("CPU ops (self time)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("aten::convolution"), std::string::npos) << r.out;
}

// bazel run //tools:ckpt: a sharded fsdp checkpoint inspected, verified, consolidated into one
// .safetensors file equal to the weights the run exported, and a damaged part found.
TEST_F(ExamplesTest, CkptToolConsolidatesAShardedCheckpointIntoTheExportedWeights) {
  Result r = run("cifar10", std::string("--config=single_cpu.yaml") + kTinyCifar +
                                " fabric.devices=2 fabric.strategy=fsdp checkpoint.format=sharded"
                                " logging.run_dir=run");
  ASSERT_EQ(r.code, 0) << r.out;
  const fs::path folder = dir_ / "run" / "checkpoints" / "step-00000003.ckpt";
  ASSERT_TRUE(fs::is_directory(folder)) << r.out;
  const std::string ckpt = "../tools/ckpt";
  Result inspect = run(ckpt, "inspect " + folder.string());
  ASSERT_EQ(inspect.code, 0) << inspect.out;
  EXPECT_NE(inspect.out.find("world_size: 2"), std::string::npos) << inspect.out;
  EXPECT_NE(inspect.out.find("model.fc.weight  Float [10, 32]"), std::string::npos) << inspect.out;
  Result verify = run(ckpt, "verify " + folder.string());
  EXPECT_EQ(verify.code, 0) << verify.out;
  EXPECT_NE(verify.out.find("every record checked, OK"), std::string::npos) << verify.out;

  const fs::path full = dir_ / "full.safetensors";
  Result consolidated = run(ckpt, "consolidate " + folder.string() + " " + full.string());
  ASSERT_EQ(consolidated.code, 0) << consolidated.out;
  Result same = run(ckpt, "diff " + full.string() + " " + (dir_ / "run" / "weights.pt").string());
  ASSERT_EQ(same.code, 0) << same.out;
  EXPECT_NE(same.out.find("0 of "), std::string::npos) << same.out;
  EXPECT_NE(same.out.find("entries differ; largest tensor difference 0"), std::string::npos)
      << same.out;

  Result no_entry = run(ckpt, "consolidate " + folder.string() + " x.pt --entry=nope");
  EXPECT_EQ(no_entry.code, 1) << no_entry.out;
  EXPECT_NE(no_entry.out.find("no entry 'nope' in the state (there: "), std::string::npos)
      << no_entry.out;
  // One byte changed in the middle of a part: verify names that file and exits 1.
  fs::path part;
  for (const auto& e : fs::directory_iterator(folder))  // the largest part
    if (e.path().filename() != "manifest.json" &&
        (part.empty() || fs::file_size(e.path()) > fs::file_size(part)))
      part = e.path();
  ASSERT_FALSE(part.empty());
  std::string data = bytes(part);
  data[data.size() / 2] ^= 0x5a;
  std::ofstream(part, std::ios::binary | std::ios::trunc) << data;
  Result damaged = run(ckpt, "verify " + folder.string());
  EXPECT_EQ(damaged.code, 1) << damaged.out;
  EXPECT_NE(damaged.out.find(part.filename().string()), std::string::npos) << damaged.out;
}

// data.batch_size: auto over 2 ranks. Under a 0.03 GiB tensor limit per rank the step of the
// tiny ResNet fits at 64 and not at 128 (measured); both ranks take 64 and train with it. With
// no limit the search is held to each rank's share of the available memory and stops at the
// largest it tries: each rank's share of the 256 examples, 128.
TEST_F(ExamplesTest, Cifar10AutoBatchSizeTakesTheLargestThatFitsOnEveryRank) {
  const std::string args = std::string("--config=single_cpu.yaml") + kTinyCifar +
                           " fabric.devices=2 data.batch_size=auto";
  Result capped = run("cifar10", args + " fabric.tensor_memory_limit_gb=0.03 logging.run_dir=c");
  ASSERT_EQ(capped.code, 0) << capped.out;
  EXPECT_NE(capped.out.find("data.batch_size: auto: 8 fits, 16 fits, 32 fits, 64 fits, 128 out "
                            "of memory, using 64"),
            std::string::npos)
      << capped.out;
  auto s = summary_of(capped);
  EXPECT_EQ(s["batch_size"], 64);
  EXPECT_EQ(s["steps"], 2);  // one epoch: 128 examples per rank in batches of 64
  EXPECT_EQ(s["batch_size_search"],
            nlohmann::json::parse("[[8,true],[16,true],[32,true],[64,true],[128,false]]"));
  Result free = run("cifar10", args + " logging.run_dir=f");
  ASSERT_EQ(free.code, 0) << free.out;
  EXPECT_EQ(summary_of(free)["batch_size"], 128) << free.out;
  // A size given is used as it is, and a word other than auto names the key.
  Result given = run("cifar10", std::string("--config=single_cpu.yaml") + kTinyCifar);
  ASSERT_EQ(given.code, 0) << given.out;
  EXPECT_EQ(summary_of(given)["batch_size"], 32);
  EXPECT_TRUE(summary_of(given)["batch_size_search"].is_null());
  Result bad = run("cifar10", "--config=single_cpu.yaml data.batch_size=lots");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("data.batch_size: 'lots' is not an integer or auto"), std::string::npos)
      << bad.out;
}

// bazel run //tools:estimate_memory against what runs measure: the cifar10 ResNet-18 (width 32,
// 64 examples per rank, SGD with momentum) over 2 ranks under ddp and fsdp, each run with the
// CPU's tensor memory counted (fabric.tensor_memory_limit_gb set high) so that summary.json has
// the largest peak of any rank. The estimate's total for the config's strategy is within 20% of
// it (measured: ddp -2%, fsdp -10% at width 64 on a Xeon).
TEST_F(ExamplesTest, EstimateMemoryIsWithinAFifthOfWhatTheRunMeasures) {
  for (const std::string strategy : {"ddp", "fsdp"}) {
    SCOPED_TRACE(strategy);
    const std::string config = "--config=" + strategy +
                               ".yaml model.width=32 data.batch_size=64 data.synthetic=true "
                               "data.synthetic_train_size=256 data.synthetic_test_size=64";
    Result estimate = run("../tools/estimate_memory", config + " --json");
    ASSERT_EQ(estimate.code, 0) << estimate.out;
    const auto e = nlohmann::json::parse(estimate.out.substr(estimate.out.find('{')));
    EXPECT_EQ(e["strategy"], strategy);
    EXPECT_EQ(e["world_size"], 2);
    double total = 0;
    for (const auto& row : e["rows"])
      if (row["strategy"] == strategy) total = row["total"].get<double>();
    Result r = run("cifar10", config +
                                  " trainer.max_steps=2 checkpoint.save_last=false "
                                  "fabric.tensor_memory_limit_gb=100 logging.run_dir=" +
                                  strategy);
    ASSERT_EQ(r.code, 0) << r.out;
    const double measured = summary_of(r)["peak_tensor_bytes"].get<double>();
    EXPECT_NEAR(total / measured, 1.0, 0.2)
        << "estimated " << total << ", measured " << measured << "\n"
        << estimate.out;
  }
  Result bad = run("../tools/estimate_memory", "--config=ddp.yaml model.widht=3");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("model.widht"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace fabric::testing
