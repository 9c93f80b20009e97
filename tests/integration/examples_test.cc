// End-to-end runs of the example binaries (data dependencies of this test): every shipped config
// that can run on a CPU, for a few steps, plus the exit statuses and error lines users see.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/integration/examples_fixture.h"

namespace fs = std::filesystem;

namespace {

using fabric::testing::ExamplesTest;
using fabric::testing::kTinyCifar;
using fabric::testing::Result;

TEST_F(ExamplesTest, FashionMnistConfigTrainsAndWritesTheSummary) {
  Result r =
      run("fashion_mnist",
          "--config=fashion_mnist.yaml fabric.accelerator=cpu trainer.max_steps=4 "
          "trainer.limit_eval_batches=2 "
          "logging.log_every_n_steps=2 model.width=4 model.hidden=8 throughput.peak_tflops=0.5");
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = summary_of(r);
  EXPECT_EQ(s["steps"], 4);
  EXPECT_EQ(s["data"], "real");
  EXPECT_EQ(s["precision"], "32-true");
  EXPECT_EQ(s["strategy"], "single_device");
  EXPECT_EQ(s["world_size"], 1);
  for (const char* key : {"config_hash", "epochs", "train_loss", "test_accuracy",
                          "images_per_second", "wall_seconds"})
    EXPECT_TRUE(s.contains(key)) << key;
  EXPECT_GT(s["test_accuracy"].get<double>(), 0.0);
  // Throughput: FLOPs counted on the first micro-batch; MFU against the configured peak.
  EXPECT_EQ(s["flops_source"], "counted");
  EXPECT_GT(s["flops_per_sample"].get<double>(), 0.0);
  EXPECT_NEAR(s["tflops"].get<double>(),
              s["images_per_second"].get<double>() * s["flops_per_sample"].get<double>() / 1e12,
              1e-9 * s["tflops"].get<double>());
  EXPECT_NEAR(s["mfu"].get<double>(), s["tflops"].get<double>() / 0.5, 1e-12);
  // The run directory holds the resolved config, and its hash is the summary's.
  const fs::path run_dir = fs::path(r.last_line()).parent_path();
  EXPECT_EQ(run_dir.string().rfind((dir_ / "runs" / "fashion_mnist").string(), 0), 0u) << run_dir;
  std::ifstream config(run_dir / "config.yaml");
  std::stringstream text;
  text << config.rdbuf();
  EXPECT_NE(text.str().find("hash " + s["config_hash"].get<std::string>()), std::string::npos);
  // Not a terminal (auto): plain progress lines, nothing redrawn.
  EXPECT_NE(r.out.find("\nepoch 1/4 step 2/4 loss "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  // metrics.csv: a row per progress line (steps 2 and 4), test accuracy at the end.
  std::ifstream metrics(run_dir / "metrics.csv");
  std::string header, row2, row4;
  std::getline(metrics, header);
  std::getline(metrics, row2);
  std::getline(metrics, row4);
  EXPECT_EQ(header,
            "step,epoch,lr,train/images_per_second,train/images_per_second_per_rank,train/loss,"
            "train/mfu,train/tflops,train/tflops_per_rank,test/accuracy");
  EXPECT_EQ(row2.rfind("2,", 0), 0u) << row2;
  EXPECT_EQ(row4.rfind("4,", 0), 0u) << row4;
  EXPECT_NE(row4.back(), ',') << "test accuracy missing: " << row4;
  bool event_file = false;
  for (const auto& e : fs::directory_iterator(run_dir))
    event_file |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  EXPECT_TRUE(event_file) << "no TensorBoard event file in " << run_dir;
}

TEST_F(ExamplesTest, ProgressBarRedrawsInPlaceWithLinesAboveIt) {
  Result r = run("fashion_mnist",
                 "--config=fashion_mnist.yaml fabric.accelerator=cpu trainer.max_steps=3 "
                 "trainer.limit_eval_batches=2 "
                 "model.width=4 model.hidden=8 logging.progress_bar=true");
  ASSERT_EQ(r.code, 0) << r.out;
  // The last step is drawn complete; the evaluation line replaces the bar and the bar follows.
  EXPECT_NE(r.out.find("\repoch 1/4 [####################] 100% 3/3 loss "), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("\x1b[K\r\x1b[Kepoch 1 test accuracy "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("step 3/3"), std::string::npos) << "no plain lines in place mode";
}

// trainer.stop_on_nonfinite: a diverging run stops with exit status 3, says why and what to do,
// and keeps its state aside where resume: auto never picks it up; under fsdp too.
TEST_F(ExamplesTest, DivergingRunStopsWithExitThreeAndKeepsItsStateAside) {
  Result r = run("fashion_mnist",
                 "--config=fashion_mnist.yaml fabric.accelerator=cpu trainer.max_steps=40 "
                 "trainer.limit_eval_batches=2 "
                 "model.width=4 model.hidden=8 optimizer.lr=1e12 trainer.stop_on_nonfinite=2");
  ASSERT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("stopped: the loss was not finite for 2 consecutive steps on rank 0 "
                       "(detected at step "),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("lower optimizer.lr"), std::string::npos) << r.out;
  auto s = summary_of(r);
  EXPECT_LT(s["steps"].get<int>(), 40);
  EXPECT_NE(s["stopped"].get<std::string>(), "");
  const fs::path aside = s["nonfinite_checkpoint"].get<std::string>();
  EXPECT_TRUE(fs::exists(aside)) << aside;
  EXPECT_EQ(aside.filename().string().rfind("nonfinite-step-", 0), 0u) << aside;
  // Off: the same run trains to the end (the loss stays non-finite).
  r = run("fashion_mnist",
          "--config=fashion_mnist.yaml fabric.accelerator=cpu trainer.max_steps=6 "
          "trainer.limit_eval_batches=2 "
          "model.width=4 model.hidden=8 optimizer.lr=1e12 trainer.stop_on_nonfinite=0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(summary_of(r)["steps"], 6);
  // Its weights are not exported: nothing is written that would pass for a result.
  const fs::path exported = fs::path(summary_of(r)["run_dir"].get<std::string>()) / "weights.pt";
  EXPECT_NE(r.out.find("warning: checkpoint.export_weights: " + exported.string() +
                       " not written: the weights are not finite (NaN or inf) after step 6"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(exported));
  // Under fsdp every rank stops at the same step; the state set aside is sharded (a folder).
  r = run("fashion_mnist",
          "--config=fashion_mnist.yaml fabric.accelerator=cpu trainer.max_steps=40 "
          "trainer.limit_eval_batches=2 model.width=4 model.hidden=8 optimizer.lr=1e12 "
          "trainer.stop_on_nonfinite=2 fabric.strategy=fsdp fabric.devices=2 "
          "fabric.fsdp.min_unit_params=100");
  ASSERT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("not finite for 2 consecutive steps on ranks 0, 1"), std::string::npos)
      << r.out;
  const fs::path sharded_aside = summary_of(r)["nonfinite_checkpoint"].get<std::string>();
  EXPECT_TRUE(fs::exists(sharded_aside / "manifest.json")) << sharded_aside;
}

// SIGTERM (a sweep's pruner, a scheduler's preemption) stops the example cleanly: a checkpoint of
// that step, exit 143, and checkpoint.resume=auto continues to the same weights, bitwise, as the
// run never stopped.
TEST_F(ExamplesTest, SigtermSavesTheStepAndResumeAutoEndsBitwiseAsTheWholeRun) {
  const std::string args =
      std::string("--config=single_cpu.yaml") + kTinyCifar +
      " trainer.max_steps=100 trainer.max_epochs=100 checkpoint.every_n_epochs=0 "
      "trainer.eval_every_n_epochs=0";
  Result whole = run("cifar10", args + " logging.run_dir=whole");
  ASSERT_EQ(whole.code, 0) << whole.out;

  // Started in the background; stopped (SIGSTOP) as soon as its first metrics row is there, sent
  // SIGTERM, continued: the signal lands early in its 100 steps (metrics every step).
  const fs::path out = dir_ / "stopped.out";
  const std::string exe = (fs::current_path() / "examples" / "cifar10").string();
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c",
          ("cd '" + dir_.string() + "' && exec '" + exe + "' " + args +
           " logging.run_dir=stopped >'" + out.string() + "' 2>&1")
              .c_str(),
          nullptr);
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  const fs::path metrics = dir_ / "stopped" / "metrics.csv";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline &&
         (!fs::exists(metrics) || fs::file_size(metrics) == 0 ||
          bytes(metrics).find('\n') == bytes(metrics).rfind('\n')))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  kill(pid, SIGSTOP);
  kill(pid, SIGTERM);
  kill(pid, SIGCONT);
  int status = 0;
  waitpid(pid, &status, 0);
  const std::string text = bytes(out);
  ASSERT_TRUE(WIFEXITED(status)) << text;
  ASSERT_EQ(WEXITSTATUS(status), 143) << text;
  const size_t at = text.find("stopped by SIGTERM at step ");
  ASSERT_NE(at, std::string::npos) << text;
  const int step = std::stoi(text.substr(at + 27));
  EXPECT_GE(step, 1);
  EXPECT_LT(step, 100);
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08d.ckpt", step);
  EXPECT_TRUE(fs::exists(dir_ / "stopped" / "checkpoints" / name)) << text;
  EXPECT_NE(text.find("(checkpoint.resume=auto continues from it)"), std::string::npos) << text;

  Result resumed = run("cifar10", args + " logging.run_dir=stopped checkpoint.resume=auto");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find(name), std::string::npos) << resumed.out;  // resumed from it
  const auto s = summary_of(resumed);
  EXPECT_EQ(s["steps"], 100);
  EXPECT_TRUE(bytes(dir_ / "whole" / "weights.pt") ==
              bytes(fs::path(s["run_dir"].get<std::string>()) / "weights.pt"))
      << resumed.out;
}

TEST_F(ExamplesTest, SingleCpuConfigRunsOnSyntheticData) {
  Result r = run("cifar10", std::string("--config=single_cpu.yaml") + kTinyCifar);
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = summary_of(r);
  EXPECT_EQ(s["steps"], 3);
  EXPECT_EQ(s["data"], "synthetic");
  EXPECT_EQ(s["device"], "cpu");
}

// Killed in the middle of writing its second checkpoint, the example resumes with
// checkpoint.resume=auto from the first and finishes the run.
TEST_F(ExamplesTest, Cifar10KilledWhileSavingResumesWithAuto) {
  const std::string args = std::string("--config=single_cpu.yaml") + kTinyCifar +
                           " trainer.max_steps=6 checkpoint.every_n_steps=2";
  Result probe = run("cifar10", args + " trainer.max_steps=2 logging.run_dir=probe");
  ASSERT_EQ(probe.code, 0) << probe.out;
  const auto bytes = fs::file_size(dir_ / "probe" / "checkpoints" / "step-00000002.ckpt");
  Result killed =
      run("cifar10", args, "FABRIC_TEST_KILL_AFTER_BYTES=" + std::to_string(bytes * 3 / 2));
  ASSERT_EQ(killed.code, 128 + 9) << killed.out;
  Result resumed = run("cifar10", args + " checkpoint.resume=auto");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  auto s = summary_of(resumed);
  EXPECT_EQ(s["steps"], 6);
  const std::string from = s["resumed_from"].get<std::string>();
  EXPECT_NE(from.find("step-00000002.ckpt"), std::string::npos) << resumed.out;
  // Python-readable weights at the end (checkpoint.export_weights).
  EXPECT_TRUE(fs::exists(fs::path(resumed.last_line()).parent_path() / "weights.pt"));
}

// The README's main command on a CPU-only machine: 2 self-launched ranks, SyncBN, 16-mixed
// resolved for the CPU (32-true where bf16 is emulated: ONEDNN_MAX_CPU_ISA=AVX2 makes every
// machine such a one, so the test does not depend on the CPU it runs on), threads split
// between the ranks (FABRIC_CPUS=4: 2 each).
TEST_F(ExamplesTest, DdpAmpConfigRunsTwoProcessesWithPerRankLogs) {
  Result r = run("cifar10",
                 std::string("--config=ddp_amp.yaml") + kTinyCifar +
                     " fabric.accelerator=cpu data.synthetic_test_size=51",
                 "env -u OMP_NUM_THREADS ONEDNN_MAX_CPU_ISA=AVX2 FABRIC_CPUS=4");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("strategy ddp, world size 2, device cpu, precision 32-true, 2 threads per "
                       "process (auto: 4 CPUs (FABRIC_CPUS) / 2 processes sharing them)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("16-mixed is not supported on CPU and bf16 would be emulated ("),
            std::string::npos)
      << r.out;
  auto s = summary_of(r);
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["threads"], 2);
  EXPECT_EQ(s["strategy"], "ddp");
  // 51 test examples over 2 ranks: rank 1 gets one padded repeat; the accuracy must be a multiple
  // of 1/51 (each example counted once), not of 1/52.
  const double correct = s["test_accuracy"].get<double>() * 51;
  EXPECT_NEAR(correct, std::round(correct), 1e-6);
  const fs::path run_dir = fs::path(r.last_line()).parent_path();
  EXPECT_TRUE(fs::exists(run_dir / "rank_1.log")) << run_dir;
  EXPECT_FALSE(fs::exists(run_dir / "rank_0.log"));
}

TEST_F(ExamplesTest, DpConfigWithoutTwoGpusRunsSingleDeviceWithAWarning) {
  Result r =
      run("cifar10", std::string("--config=dp.yaml") + kTinyCifar + " fabric.accelerator=cpu");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fabric.strategy: dp needs 2 or more CUDA devices (have 1 device on cpu); "
                       "running single_device instead"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(summary_of(r)["strategy"], "single_device");
}

TEST_F(ExamplesTest, MissingRealDataFallsBackWithABannerOrFailsWhenRequired) {
  Result r = run("cifar10", std::string("--config=single_cpu.yaml") + kTinyCifar +
                                " data.synthetic=false data.download=false data.root=nowhere");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Training on a deterministic SYNTHETIC CIFAR-format dataset"),
            std::string::npos);
  Result strict =
      run("cifar10",
          std::string("--config=single_cpu.yaml") + kTinyCifar +
              " data.synthetic=false data.download=false data.root=nowhere data.require_real=true");
  EXPECT_EQ(strict.code, 2) << strict.out;
  EXPECT_NE(strict.out.find("command line: data.require_real: CIFAR-10 not found in " +
                            (dir_ / "nowhere").string()),
            std::string::npos)
      << strict.out;
}

// GPU configs pinned to the CPU: 16-mixed falls back to 32-true where bf16 is emulated (forced
// here with ONEDNN_MAX_CPU_ISA=AVX2), an explicit bf16-mixed stays bf16 with a warning.
TEST_F(ExamplesTest, GpuConfigsRunOnCpuWhenToldAndMixedPrecisionFallsBack) {
  for (const char* config : {"single_gpu.yaml", "amp.yaml", "bf16.yaml"}) {
    Result r =
        run("cifar10", std::string("--config=") + config + kTinyCifar + " fabric.accelerator=cpu",
            "ONEDNN_MAX_CPU_ISA=AVX2");
    ASSERT_EQ(r.code, 0) << config << "\n" << r.out;
    auto s = summary_of(r);
    const std::string want = std::string(config) == "bf16.yaml" ? "bf16-mixed" : "32-true";
    EXPECT_EQ(s["precision"], want) << config;
    if (std::string(config) == "amp.yaml") {
      EXPECT_NE(
          r.out.find(
              "warning: configs/amp.yaml:4:14: fabric.precision: 16-mixed is not supported on "
              "CPU and bf16 would be emulated"),
          std::string::npos)
          << r.out;
    }
    if (std::string(config) == "bf16.yaml") {
      EXPECT_NE(r.out.find("fabric.precision: bf16-mixed is emulated on this CPU"),
                std::string::npos)
          << r.out;
    }
  }
}

TEST_F(ExamplesTest, DdpConfigTrainsWithTwoSelfLaunchedProcesses) {
  Result r =
      run("cifar10", std::string("--config=ddp.yaml") + kTinyCifar + " fabric.accelerator=cpu");
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = summary_of(r);
  EXPECT_EQ(s["strategy"], "ddp");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["steps"], 3);
  // Only rank 0 prints: one header line, one summary path.
  size_t headers = 0;
  for (size_t pos = 0; (pos = r.out.find("cifar10: synthetic data", pos)) != std::string::npos;
       ++pos)
    ++headers;
  EXPECT_EQ(headers, 1u) << r.out;
}

// Both examples train unchanged under fsdp (configs/fsdp.yaml), with units small enough that the
// tiny models have several.
TEST_F(ExamplesTest, FsdpConfigTrainsBothExamplesUnchanged) {
  Result cifar = run("cifar10", std::string("--config=fsdp.yaml") + kTinyCifar +
                                    " fabric.accelerator=cpu fabric.fsdp.min_unit_params=100");
  ASSERT_EQ(cifar.code, 0) << cifar.out;
  auto s = summary_of(cifar);
  EXPECT_EQ(s["strategy"], "fsdp");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_EQ(s["steps"], 3);
  Result mnist = run("fashion_mnist",
                     "--config=fashion_mnist.yaml fabric.accelerator=cpu fabric.strategy=fsdp "
                     "fabric.devices=2 fabric.fsdp.min_unit_params=100 trainer.max_steps=4 "
                     "trainer.limit_eval_batches=2 model.width=4 model.hidden=8");
  ASSERT_EQ(mnist.code, 0) << mnist.out;
  EXPECT_EQ(summary_of(mnist)["strategy"], "fsdp");
  // model_parallel at tensor_parallel_size 1 is fsdp: a model without a tensor-parallel plan
  // trains (it was refused), and sequence_parallel is said to do nothing.
  Result mp = run("fashion_mnist",
                  "--config=fashion_mnist.yaml fabric.accelerator=cpu "
                  "fabric.strategy=model_parallel fabric.devices=2 "
                  "fabric.model_parallel.tensor_parallel_size=1 "
                  "fabric.model_parallel.sequence_parallel=true trainer.max_steps=2 "
                  "trainer.limit_eval_batches=1 model.width=4 model.hidden=8");
  ASSERT_EQ(mp.code, 0) << mp.out;
  EXPECT_NE(mp.out.find("tensor_parallel_size 1: no module split"), std::string::npos) << mp.out;
  EXPECT_NE(mp.out.find("sequence_parallel has no effect at tensor_parallel_size 1"),
            std::string::npos)
      << mp.out;
}

TEST_F(ExamplesTest, CudaConfigWithoutAGpuIsAConfigError) {
  // CUDA_VISIBLE_DEVICES empty hides every GPU, so this holds on GPU machines too.
  Result r = run("cifar10", "--config=amp.yaml", "CUDA_VISIBLE_DEVICES=");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("configs/single_gpu.yaml:4:16: fabric.accelerator: 'cuda' requested but"),
            std::string::npos)
      << r.out;
}

TEST_F(ExamplesTest, MalformedConfigsExitTwoWithOneLine) {
  std::ofstream(dir_ / "bad.yaml") << "base: single_cpu.yaml\nfabric:\n  precision: 16-mixd\n";
  Result r = run("cifar10", "--config=bad.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(
      r.out,
      "bad.yaml:3:14: fabric.precision: '16-mixd' is not a precision; did you mean '16-mixed'? "
      "(one of 32-true, 64-true, 16-mixed, bf16-mixed, 16-true, bf16-true, fp8-mixed)\n");
  r = run("fashion_mnist", "--config=fashion_mnist.yaml optimizer.lr=fast");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "command line: optimizer.lr: 'fast' is not a number\n");
  // drop_last with fewer examples than a batch: refused before training (no step would run).
  r = run("fashion_mnist",
          "--config=fashion_mnist.yaml data.drop_last=true data.batch_size=10000000");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("data.drop_last: true leaves no full batch"), std::string::npos) << r.out;
  r = run("fashion_mnist", "--confg=fashion_mnist.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "command line: unknown flag '--confg'; did you mean '--config'? (see --help)\n");
  r = run("fashion_mnist", "--config=fashon_mnist.yaml");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(
      r.out.find("config file 'fashon_mnist.yaml' not found; did you mean 'fashion_mnist.yaml'?"),
      std::string::npos)
      << r.out;
}

TEST_F(ExamplesTest, PrintConfigAndHelpExitZero) {
  Result r = run("cifar10", "--config=amp.yaml --print_config");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("precision: 16-mixed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("accelerator: cuda"), std::string::npos) << r.out;  // from the base chain
  EXPECT_NE(r.out.find("max_epochs: 30"), std::string::npos) << r.out;     // from cifar10.yaml
  EXPECT_NE(r.out.find("width: 64"), std::string::npos) << r.out;          // the example's own key
  r = run("fashion_mnist", "--help");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model.hidden [128] an integer"), std::string::npos) << r.out;
}

}  // namespace
