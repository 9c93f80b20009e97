#include "fabric/connector.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include <map>

#include "tests/fabric/connector_testing.h"

namespace {

using fabric::Config;
using fabric::ConfigError;
using fabric::MachineFacts;
using fabric::PrecisionMode;
using fabric::StrategyKind;
namespace strategies = fabric::strategies;
namespace distributed = fabric::distributed;
using namespace fabric::testing;  // NOLINT

struct Row {
  std::vector<std::string> overrides;
  MachineFacts machine;
  c10::DeviceType accelerator;
  std::string device;
  PrecisionMode precision;
};

TEST(ConnectorTest, DataParallelIsOneProcessOverEveryGpuOrFallsBackWithAWarning) {
  auto s = resolve({"fabric.strategy=dp"}, gpu_machine(3));
  EXPECT_EQ(s.strategy, StrategyKind::kDp);
  EXPECT_EQ(s.devices.size(), 3u);
  EXPECT_EQ(s.environment->world_size(), 1);  // never self-launches
  EXPECT_EQ(build_strategy(s)->name(), "dp");
  EXPECT_TRUE(s.warnings.empty());
  for (const auto& m : {gpu_machine(1), cpu_machine()}) {
    s = resolve({"fabric.strategy=dp"}, m);
    EXPECT_EQ(s.strategy, StrategyKind::kSingleDevice);
    EXPECT_EQ(s.devices.size(), 1u);
    ASSERT_EQ(s.warnings.size(), 1u);
    EXPECT_NE(s.warnings[0].find("fabric.strategy: dp needs 2 or more CUDA devices (have 1 device"),
              std::string::npos)
        << s.warnings[0];
  }
}

// fsdp keys someone set, under another strategy, configure nothing: one warning names them.
TEST(ConnectorTest, FsdpKeysUnderAnotherStrategyAreSaidToHaveNoEffect) {
  auto s = resolve(
      {"fabric.strategy=ddp", "fabric.fsdp.min_unit_params=5", "fabric.fsdp.wrap_modules=Linear"},
      cpu_machine());
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0],
            "command line: fabric.fsdp.wrap_modules, fabric.fsdp.min_unit_params: have no effect "
            "under fabric.strategy: ddp (fabric.fsdp keys configure fsdp)");
  EXPECT_TRUE(resolve({"fabric.strategy=fsdp", "fabric.fsdp.min_unit_params=5"}, cpu_machine())
                  .warnings.empty());
  EXPECT_TRUE(resolve({"fabric.strategy=ddp"}, cpu_machine()).warnings.empty());
  // cpu_offload's gradients are in host memory, where 16-mixed's scaler does not look (a CUDA
  // machine: on CPU 16-mixed becomes bf16-mixed).
  EXPECT_EQ(error_of({"fabric.strategy=fsdp", "fabric.devices=2", "fabric.precision=16-mixed",
                      "fabric.fsdp.cpu_offload=true"},
                     gpu_machine(2)),
            "command line: fabric.fsdp.cpu_offload: true is not supported with fabric.precision: "
            "16-mixed (its loss scaler checks the gradients on the device, the offloaded ones are "
            "in host memory); use bf16-mixed or false");
  EXPECT_TRUE(resolve({"fabric.strategy=fsdp", "fabric.devices=2", "fabric.precision=bf16-mixed",
                       "fabric.fsdp.cpu_offload=true"},
                      gpu_machine(2))
                  .warnings.empty());
}

TEST(ConnectorTest, AutoDevicesWithDdpMeanEveryGpuOrTwoCpuProcesses) {
  auto s = resolve({"fabric.strategy=ddp"}, gpu_machine(4));
  EXPECT_EQ(s.devices.size(), 4u);
  EXPECT_EQ(s.environment->world_size(), 4);
  s = resolve({"fabric.strategy=ddp"}, cpu_machine());
  EXPECT_EQ(s.devices.size(), 2u);
  EXPECT_EQ(s.environment->world_size(), 2);
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);
  s = resolve({"fabric.strategy=ddp", "fabric.devices=1"}, cpu_machine());
  EXPECT_EQ(s.environment->world_size(), 1);
  EXPECT_EQ(resolve({}, gpu_machine(4)).devices.size(), 1u);  // auto strategy: one device
}

TEST(ConnectorTest, ResolvesRequestsAgainstTheMachine) {
  const std::vector<Row> table = {
      {{}, cpu_machine(), c10::DeviceType::CPU, "cpu", PrecisionMode::k32True},
      {{}, gpu_machine(2), c10::DeviceType::CUDA, "cuda:0", PrecisionMode::k32True},
      {{"fabric.accelerator=cpu"},
       gpu_machine(2),
       c10::DeviceType::CPU,
       "cpu",
       PrecisionMode::k32True},
      {{"fabric.devices=[1]"},
       gpu_machine(2),
       c10::DeviceType::CUDA,
       "cuda:1",
       PrecisionMode::k32True},
      {{"fabric.devices=1", "fabric.precision=16"},
       gpu_machine(1),
       c10::DeviceType::CUDA,
       "cuda:0",
       PrecisionMode::k16Mixed},
      {{"fabric.precision=bf16-true"},
       cpu_machine(),
       c10::DeviceType::CPU,
       "cpu",
       PrecisionMode::kBf16True},
      {{"fabric.precision=64"}, cpu_machine(), c10::DeviceType::CPU, "cpu", PrecisionMode::k64True},
      {{"fabric.devices=-1"},
       gpu_machine(1),
       c10::DeviceType::CUDA,
       "cuda:0",
       PrecisionMode::k32True},
      // A CUDA build whose LibTorch has no CUDA part, or no device: auto falls back to the CPU.
      {{}, facts(true, false, 0, false, ""), c10::DeviceType::CPU, "cpu", PrecisionMode::k32True},
      {{}, gpu_machine(0), c10::DeviceType::CPU, "cpu", PrecisionMode::k32True},
  };
  for (const auto& row : table) {
    auto s = resolve(row.overrides, row.machine);
    std::string label;
    for (const auto& o : row.overrides) label += o + " ";
    EXPECT_EQ(s.accelerator, row.accelerator) << label;
    ASSERT_EQ(s.devices.size(), 1u) << label;
    EXPECT_EQ(s.devices[0].str(), row.device) << label;
    EXPECT_EQ(s.precision, row.precision) << label;
    EXPECT_EQ(s.strategy, StrategyKind::kSingleDevice) << label;
  }
}

TEST(ConnectorTest, ImpossibleRequestsSayWhyAndWhatToDo) {
  EXPECT_EQ(
      error_of({"fabric.accelerator=cuda"}, cpu_machine()),
      "command line: fabric.accelerator: 'cuda' requested but this binary was built without "
      "CUDA (--config=cpu_only or a CPU-only LibTorch): use fabric.accelerator=cpu or rebuild");
  EXPECT_EQ(
      error_of({"fabric.accelerator=cuda"}, facts(true, false, 0, false, "")),
      "command line: fabric.accelerator: 'cuda' requested but the loaded LibTorch has no CUDA "
      "support: install the CUDA build of torch (tools/setup.sh) or use fabric.accelerator=cpu");
  EXPECT_EQ(
      error_of({"fabric.accelerator=gpu"}, facts(true, true, 0, false, "-1")),
      "command line: fabric.accelerator: 'cuda' requested but no CUDA device is visible "
      "(CUDA_VISIBLE_DEVICES='-1'): use fabric.accelerator=cpu or auto, or run on a GPU machine");
  EXPECT_EQ(error_of({"fabric.devices=4"}, gpu_machine(1)),
            "command line: fabric.devices: 4 devices requested but this machine has 1 CUDA device");
  EXPECT_EQ(error_of({"fabric.devices=[2]"}, gpu_machine(2)),
            "command line: fabric.devices: device id 2 does not exist: this machine has 2 CUDA "
            "devices (ids 0..1)");
  EXPECT_EQ(error_of({"fabric.devices=-1", "fabric.accelerator=cpu"}, cpu_machine()),
            "command line: fabric.devices: -1 (every CUDA device) does not apply to cpu: give a "
            "process count >= 1, or auto (2 processes with ddp, else 1)");
  EXPECT_EQ(error_of({"fabric.devices=-1"}, cpu_machine()),  // auto accelerator, no GPU
            "command line: fabric.devices: -1 (every CUDA device) does not apply to cpu: give a "
            "process count >= 1, or auto (2 processes with ddp, else 1)");
  EXPECT_EQ(error_of({"fabric.devices=[0]"}, cpu_machine()),
            "command line: fabric.devices: device ids apply to cuda only; on cpu give a process "
            "count (1)");
}

TEST(ConnectorTest, SeveralProcessesMeanDdp) {
  auto s = resolve({"fabric.devices=2"}, cpu_machine());
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);
  EXPECT_EQ(s.environment->world_size(), 2);
  EXPECT_EQ(s.environment->name(), "local");
  EXPECT_EQ(s.device.str(), "cpu");
  s = resolve({"fabric.devices=2"}, gpu_machine(2));
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);
  EXPECT_EQ(s.device.str(), "cuda:0");  // rank 0 of the self-launched job
  s = resolve({"fabric.strategy=ddp", "fabric.devices=1"}, cpu_machine());
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);  // ddp with one process is allowed
  EXPECT_EQ(s.environment->world_size(), 1);
  EXPECT_EQ(s.ddp.timeout, std::chrono::milliseconds(300000));
}

// fabric.ddp.cuda_backend: NCCL for CUDA tensors unless gloo is asked for; ranks_per_gpu N puts
// N self-launched ranks on each GPU, which only Gloo can serve.
TEST(ConnectorTest, CudaBackendAndRanksSharingAGpu) {
  auto s = resolve({"fabric.devices=2"}, gpu_machine(2));
  EXPECT_FALSE(s.ddp.cuda_with_gloo);  // auto: nccl
  s = resolve({"fabric.devices=2", "fabric.ddp.cuda_backend=gloo"}, gpu_machine(2));
  EXPECT_TRUE(s.ddp.cuda_with_gloo);
  s = resolve({"fabric.strategy=fsdp", "fabric.devices=1", "fabric.ddp.ranks_per_gpu=3"},
              gpu_machine(1));
  EXPECT_EQ(s.strategy, StrategyKind::kFsdp);
  EXPECT_TRUE(s.ddp.cuda_with_gloo);  // auto with ranks sharing a GPU: gloo
  EXPECT_EQ(s.environment->world_size(), 3);
  ASSERT_EQ(s.devices.size(), 3u);
  for (const auto& d : s.devices) EXPECT_EQ(d.str(), "cuda:0");
  s = resolve({"fabric.devices=[0, 1]", "fabric.ddp.ranks_per_gpu=2"}, gpu_machine(2));
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);  // auto strategy, 4 processes
  ASSERT_EQ(s.devices.size(), 4u);
  EXPECT_EQ(s.devices[1].str(), "cuda:0");
  EXPECT_EQ(s.devices[2].str(), "cuda:1");
  EXPECT_EQ(
      error_of({"fabric.devices=1", "fabric.ddp.ranks_per_gpu=2", "fabric.ddp.cuda_backend=nccl"},
               gpu_machine(1)),
      "command line: fabric.ddp.cuda_backend: nccl cannot run 2 ranks on one GPU "
      "(fabric.ddp.ranks_per_gpu; NCCL refuses them: \"Duplicate GPU detected\"): use "
      "gloo or auto, or ranks_per_gpu=1");
  EXPECT_EQ(error_of({"fabric.accelerator=cpu", "fabric.ddp.ranks_per_gpu=2"}, cpu_machine()),
            "command line: fabric.ddp.ranks_per_gpu: 2 applies to cuda only; on cpu "
            "fabric.devices=N is the process count");
  EXPECT_EQ(error_of({"fabric.strategy=dp", "fabric.ddp.ranks_per_gpu=2"}, gpu_machine(2)),
            "command line: fabric.ddp.ranks_per_gpu: 2 needs one process per rank: use "
            "fabric.strategy ddp or fsdp, not dp");
  // Gloo's collectives cannot be captured in a CUDA graph.
  s = resolve({"fabric.cuda_graphs=true", "fabric.devices=1", "fabric.ddp.ranks_per_gpu=2"},
              gpu_machine(1));
  EXPECT_FALSE(s.cuda_graphs);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("cannot be captured"), std::string::npos) << s.warnings[0];
}

// Under torchrun --nproc-per-node=2 the processes are the launcher's: fabric.devices may say auto,
// -1 or the same count, and anything else is an error rather than ignored.
TEST(ConnectorTest, DevicesThatContradictTheLauncherAreAnError) {
  for (const bool gpu : {false, true}) {
    MachineFacts m = gpu ? gpu_machine(2) : cpu_machine();
    m.environment = [](const std::string& name) -> std::optional<std::string> {
      const std::map<std::string, std::string> vars = {
          {"TORCHELASTIC_RUN_ID", "x"}, {"RANK", "1"},
          {"WORLD_SIZE", "2"},          {"LOCAL_RANK", "1"},
          {"LOCAL_WORLD_SIZE", "2"},    {"MASTER_PORT", "29500"}};
      auto it = vars.find(name);
      return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
    };
    SCOPED_TRACE(gpu ? "gpu" : "cpu");
    const std::string launcher = resolve({}, m).environment->name();
    EXPECT_EQ(error_of({"fabric.devices=1"}, m),
              "command line: fabric.devices: 1 (1 process on this machine) contradicts " +
                  launcher + ", which started 2 here; use auto (the launcher decides) or 2");
    EXPECT_EQ(resolve({"fabric.devices=2"}, m).environment->world_size(), 2);
    EXPECT_EQ(resolve({"fabric.devices=auto"}, m).environment->world_size(), 2);
    if (gpu) {
      EXPECT_EQ(resolve({"fabric.devices=-1"}, m).device.str(), "cuda:1");
      EXPECT_EQ(error_of({"fabric.devices=[1]"}, m),
                "command line: fabric.devices: [1] (1 process on this machine) contradicts " +
                    launcher +
                    ", which started 2 here; use auto (the launcher decides) or a "
                    "list of 2 ids");
    }
  }
}

TEST(ConnectorTest, ExternalLaunchersSetTheWorld) {
  MachineFacts m = gpu_machine(4);
  m.environment = [](const std::string& name) -> std::optional<std::string> {
    const std::map<std::string, std::string> vars = {{"TORCHELASTIC_RUN_ID", "x"},
                                                     {"RANK", "5"},
                                                     {"WORLD_SIZE", "8"},
                                                     {"LOCAL_RANK", "1"},
                                                     {"MASTER_PORT", "29500"}};
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  auto s = resolve({"fabric.devices=4"}, m);
  EXPECT_EQ(s.strategy, StrategyKind::kDdp);
  EXPECT_EQ(s.environment->world_size(), 8);
  EXPECT_EQ(s.environment->global_rank(), 5);
  EXPECT_EQ(s.device.str(), "cuda:1");  // the local rank picks the device
  EXPECT_EQ(error_of({"fabric.strategy=single_device", "fabric.devices=4"}, m),
            "command line: fabric.strategy: 'single_device' cannot run 8 processes (from "
            "fabric.devices or the launcher): use ddp or auto");
  EXPECT_EQ(error_of({"fabric.ddp.gradient_as_bucket_view=true"}, cpu_machine()),
            "command line: fabric.ddp.gradient_as_bucket_view: true is not supported: LibTorch's "
            "C++ Optimizer::zero_grad() detaches gradients in place, which bucket views forbid; "
            "use false");
}

// devices: auto under a launcher: the local rank's GPU, or the one GPU a per-rank
// CUDA_VISIBLE_DEVICES leaves visible.
TEST(ConnectorTest, AutoDevicesUnderALauncherUseTheRanksGpu) {
  const std::map<std::string, std::string> torchrun = {{"TORCHELASTIC_RUN_ID", "x"},
                                                       {"RANK", "3"},
                                                       {"WORLD_SIZE", "4"},
                                                       {"LOCAL_RANK", "3"},
                                                       {"MASTER_PORT", "29500"}};
  MachineFacts one = gpu_machine(1);
  one.environment = env_of(torchrun);
  for (const char* strategy : {"auto", "ddp"}) {
    auto s = resolve({std::string("fabric.strategy=") + strategy}, one);
    EXPECT_EQ(s.device.str(), "cuda:0") << strategy;
    EXPECT_EQ(s.strategy, StrategyKind::kDdp);
    EXPECT_EQ(s.ddp.timeout, std::chrono::milliseconds(300000));  // DDP options still resolved
  }
  MachineFacts eight = gpu_machine(8);
  eight.environment = env_of(torchrun);
  EXPECT_EQ(resolve({}, eight).device.str(), "cuda:3");
  EXPECT_EQ(resolve({"fabric.devices=-1"}, eight).device.str(), "cuda:3");
  // An explicit device list that leaves this rank out is still an error.
  EXPECT_EQ(error_of({"fabric.devices=[0]"}, eight),
            "command line: fabric.devices: local rank 3 has no device: 1 device listed for this "
            "machine");
}

// cuBLAS throws in deterministic mode unless CUBLAS_WORKSPACE_CONFIG is set before its first use.
TEST(ConnectorTest, DeterministicOnCudaSetsTheCublasWorkspace) {
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  fabric::apply_global_settings(resolve({"fabric.deterministic=true"}, cpu_machine()));
  EXPECT_EQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);  // CPU: not needed
  fabric::apply_global_settings(resolve({}, gpu_machine(1)));
  EXPECT_EQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);  // not deterministic
  fabric::apply_global_settings(resolve({"fabric.deterministic=true"}, gpu_machine(1)));
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":4096:8");
  setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);  // the user's choice stays
  fabric::apply_global_settings(resolve({"fabric.deterministic=true"}, gpu_machine(1)));
  EXPECT_STREQ(std::getenv("CUBLAS_WORKSPACE_CONFIG"), ":16:8");
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  at::globalContext().setDeterministicAlgorithms(false, false);
}

TEST(ConnectorTest, UnsupportedDistributedRequestsAreRejectedNeverIgnored) {
  EXPECT_EQ(error_of({"fabric.num_nodes=2"}, cpu_machine()),
            "command line: fabric.num_nodes: 2 nodes need an external launcher (torchrun, srun or "
            "mpirun) that starts the processes on every node; or use 1");
  EXPECT_EQ(error_of({"fabric.strategy=single_device", "fabric.devices=3"}, cpu_machine()),
            "command line: fabric.strategy: 'single_device' cannot run 3 processes (from "
            "fabric.devices or the launcher): use ddp or auto");
}

TEST(ConnectorTest, SettingsFollowTheDocumentedRules) {
  auto s = resolve({}, cpu_machine());
  EXPECT_TRUE(s.cudnn_benchmark);  // auto → !deterministic
  EXPECT_FALSE(s.deterministic);
  EXPECT_EQ(s.seed, 42u);
  s = resolve({"fabric.deterministic=true", "fabric.seed=7", "fabric.grad_scaler.init_scale=1024"},
              cpu_machine());
  EXPECT_FALSE(s.cudnn_benchmark);
  EXPECT_EQ(s.seed, 7u);
  EXPECT_EQ(s.scaler.init_scale(), 1024.0);
  s = resolve({"fabric.ddp.comm_hook=bf16", "fabric.devices=2", "fabric.sync_batchnorm=true"},
              cpu_machine());
  EXPECT_EQ(s.ddp.comm_hook, strategies::CommHook::kBf16);
  EXPECT_TRUE(s.ddp.sync_batchnorm);
  EXPECT_TRUE(s.warnings.empty());
  s = resolve({"fabric.sync_batchnorm=true"}, cpu_machine());  // one process
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("has no effect with a single process"), std::string::npos);
  EXPECT_EQ(s.ddp.cpu_backend, distributed::CpuBackend::kAuto);
  s = resolve({"fabric.ddp.cpu_backend=gloo", "fabric.devices=2"}, cpu_machine());
  EXPECT_EQ(s.ddp.cpu_backend, distributed::CpuBackend::kGloo);
  // channels_last: off unless asked; auto turns it on for CUDA only (ddp_amp.yaml runs both).
  EXPECT_FALSE(resolve({}, gpu_machine(1)).channels_last);
  EXPECT_TRUE(resolve({"fabric.channels_last=auto"}, gpu_machine(1)).channels_last);
  EXPECT_FALSE(resolve({"fabric.channels_last=auto"}, cpu_machine()).channels_last);
  s = resolve({"fabric.channels_last=true"}, cpu_machine());
  EXPECT_TRUE(s.channels_last);  // as asked, with one warning (a oneDNN bug on AVX2)
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_EQ(s.warnings[0].rfind("command line: fabric.channels_last: on CPU", 0), 0u)
      << s.warnings[0];
  EXPECT_TRUE(resolve({"fabric.channels_last=true"}, gpu_machine(1)).warnings.empty());
}

// fabric.cuda_graphs holds for one CUDA device per process (single_device, ddp); elsewhere one
// warning says why steps run eagerly, and the same config still runs.
TEST(ConnectorTest, CudaGraphsOnlyOnOneCudaDevicePerProcessElseAWarning) {
  auto s = resolve({"fabric.cuda_graphs=true"}, gpu_machine(1));
  EXPECT_TRUE(s.cuda_graphs);
  EXPECT_TRUE(s.warnings.empty());
  EXPECT_FALSE(resolve({}, gpu_machine(1)).cuda_graphs);  // off by default
  s = resolve({"fabric.cuda_graphs=true"}, cpu_machine());
  EXPECT_FALSE(s.cuda_graphs);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("fabric.cuda_graphs: steps run eagerly: CUDA graphs need a CUDA "
                               "device and this run is on cpu"),
            std::string::npos)
      << s.warnings[0];
  s = resolve({"fabric.cuda_graphs=true", "fabric.strategy=dp"}, gpu_machine(2));
  EXPECT_FALSE(s.cuda_graphs);
  ASSERT_EQ(s.warnings.size(), 1u);
  EXPECT_NE(s.warnings[0].find("capture under strategy dp is not implemented yet"),
            std::string::npos)
      << s.warnings[0];
  // DDP captures its all-reduce, except where a step needs the host or its gradients vary.
  s = resolve({"fabric.cuda_graphs=true", "fabric.strategy=ddp"}, gpu_machine(2));
  EXPECT_TRUE(s.cuda_graphs);
  EXPECT_TRUE(s.warnings.empty());
  const std::pair<const char*, const char*> refusals[] = {
      {"fabric.sync_batchnorm=true", "SyncBatchNorm reads the global batch size on the host"},
      {"fabric.ddp.find_unused_parameters=true",
       "fabric.ddp.find_unused_parameters: a step whose set of gradients can change cannot be "
       "replayed"}};
  for (const auto& [key, why] : refusals) {
    s = resolve({"fabric.cuda_graphs=true", "fabric.strategy=ddp", key}, gpu_machine(2));
    EXPECT_FALSE(s.cuda_graphs) << key;
    ASSERT_EQ(s.warnings.size(), 1u) << key;
    EXPECT_NE(s.warnings[0].find(std::string("fabric.cuda_graphs: steps run eagerly: ") + why),
              std::string::npos)
        << s.warnings[0];
  }
}

}  // namespace
