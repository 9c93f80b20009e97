// fabric::Connector: turns a Config into complete objects, in numbered steps. Each step either
// produces a fully determined value or throws ConfigError located at the responsible key.
//
//   1. accelerator  auto → cuda when this build has CUDA, the loaded LibTorch has CUDA and a device
//                   is visible; else cpu. `cuda` without any of those is an error saying which.
//   2. devices      auto → with strategy ddp or dp: every visible CUDA device, or on cpu
//                   2 processes (ddp; the smallest real DDP job); otherwise 1 device (cuda:0, or
//                   one CPU process). N → N devices (on cpu: N processes), -1 → all CUDA devices
//                   (on cpu: an error, as in Lightning), [ids] → those (cuda only; ids must exist).
//   3. strategy     the job comes from the launch environment (fabric/environments/environments.h):
//                   torchrun/SLURM/MPI/RANK+WORLD_SIZE give the world size; otherwise Fabric
//                   self-launches devices × 1 processes (num_nodes > 1 needs an external launcher).
//                   auto → ddp when the world has more than one process, else single_device.
//                   fabric.max_restarts > 0 in a self-launched job: the process the user started
//                   becomes the restart agent (restart_agent); under an external launcher one
//                   warning line points to the launcher's own restarts (torchrun --max-restarts).
//                   single_device with several processes is an error. dp (one process) needs 2+
//                   CUDA devices; otherwise it runs single_device with one warning line.
//   4. precision    as configured, except: 16-mixed on CPU → bf16-mixed where the CPU computes
//                   bf16 natively (avx512_bf16/amx_bf16, and ONEDNN_MAX_CPU_ISA does not hold
//                   oneDNN below them), else 32-true, with one warning line either way; an explicit
//                   bf16-* on a CPU that emulates bf16 warns that it is slow; 16-true on CPU is an
//                   error; bf16 on a GPU without bf16 (< sm_80) is an error.
//   5. settings     deterministic (deterministic algorithms; cudnn.benchmark off),
//                   cudnn_benchmark (auto → !deterministic), matmul_precision, channels_last
//                   (auto → on CUDA),
//                   cuda_graphs (CUDA single_device or ddp without sync_batchnorm and
//                   find_unused_parameters; elsewhere a warning), seed, GradScaler.
//   6. threads      intra- and inter-op threads of this process: fabric.num_threads when > 0,
//                   else OMP_NUM_THREADS when set, else (auto) the CPUs this process may use
//                   (FABRIC_CPUS, else its affinity mask capped by the cgroup CPU quota) ÷ the
//                   processes of the job on this machine that share them (at least 1). Ranks of
//                   an external launcher bound to narrower masks share them with fewer ranks.
//
// Warnings are returned as lines for Fabric to print once (rank 0).
#ifndef FABRIC_CONNECTOR_H_
#define FABRIC_CONNECTOR_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "fabric/accelerators/cpu_info.h"
#include "fabric/config/config.h"
#include "fabric/core/cluster_environment.h"
#include "fabric/precision/precision.h"
#include "strategies/ddp_options.h"
#include "strategies/strategy.h"

namespace fabric {

// What the machine offers; query() reads it, tests fake it.
struct MachineFacts {
  bool cuda_compiled = false;      // FABRIC_WITH_CUDA in this build
  bool libtorch_has_cuda = false;  // the loaded LibTorch has its CUDA part
  int64_t cuda_device_count = 0;
  bool cuda_bf16_supported = false;         // every visible device has compute capability ≥ 8.0
  bool cuda_fp8_supported = false;          // every visible device has compute capability ≥ 8.9
  bool cuda_fp8_rowwise_supported = false;  // every visible device has compute capability ≥ 9.0
  std::string cuda_visible_devices;         // $CUDA_VISIBLE_DEVICES, for messages
  EnvGetter environment;  // launch variables (RANK, SLURM_*, ...); empty: none set
  CpuInfo cpu;            // CPUs usable here, native bf16; all zero/false: unknown

  static MachineFacts query();
};

// fabric.strategy after step 3 (auto and the dp fallback decided).
enum class StrategyKind { kSingleDevice, kDp, kDdp, kFsdp, kModelParallel };
// "single_device" | "dp" | "ddp" | "fsdp" | "model_parallel": the config's word, and
// Strategy::name() of what build_strategy makes.
const char* strategy_name(StrategyKind kind);

struct ResolvedSetup {
  c10::DeviceType accelerator = c10::DeviceType::CPU;
  std::vector<torch::Device> devices;  // this machine's devices, one per local process
  StrategyKind strategy = StrategyKind::kSingleDevice;
  std::shared_ptr<ClusterEnvironment> environment;  // the job (world size, ranks, rendezvous)
  torch::Device device = torch::kCPU;               // this process's device
  strategies::DdpOptions ddp;                       // also the process group settings of fsdp
  strategies::FsdpOptions fsdp;                     // fabric.fsdp.* (also model_parallel's)
  strategies::ModelParallelOptions model_parallel;  // fabric.model_parallel.*, resolved
  PrecisionMode precision = PrecisionMode::k32True;
  std::vector<std::string> fp8_exclude;  // fabric.fp8.exclude_modules
  bool fp8_rowwise = false;              // fabric.fp8.recipe: rowwise
  int64_t fp8_amax_history = 0;          // recipe delayed: fabric.fp8.amax_history; else 0
  bool fp8_fast_accumulation = true;     // fabric.fp8.fast_accumulation
  int64_t fp8_grad_margin = 3;           // fabric.fp8.grad_margin (read under recipe delayed)
  GradScalerOptions scaler;
  uint64_t seed = 0;
  bool deterministic = false;
  bool cudnn_benchmark = false;
  std::string matmul_precision = "highest";
  bool channels_last = false;  // fabric.channels_last
  // checkpoint.format: "full" | "sharded" | "auto" (Fabric::saves_sharded decides auto by the
  // strategy's sharded state).
  std::string checkpoint_format = "auto";
  // fabric.cuda_graphs, after resolution: true only on a CUDA device with strategy single_device,
  // or ddp without sync_batchnorm and find_unused_parameters (otherwise one warning line says
  // why steps run eagerly). Read by fabric::GraphedStep.
  bool cuda_graphs = false;
  // Step 6: intra-/inter-op threads this process uses (0: unknown machine, LibTorch's default
  // left alone) and why, e.g. "auto: 2 CPUs / 2 processes sharing them" or "OMP_NUM_THREADS".
  int64_t num_threads = 0;
  std::string threads_reason;
  // fabric.memory_limit_gb: Fabric::step fails once a process's peak resident host memory
  // exceeds it (0: off).
  double memory_limit_gb = 0;
  // fabric.tensor_memory_limit_gb: the most tensor memory a process may hold on its device
  // (fabric/accelerators/memory.h; 0: no limit), and fabric.empty_init (Fabric::init_module).
  double tensor_memory_limit_gb = 0;
  bool empty_init = false;
  // fabric.max_restarts / restart_backoff_s (fabric/distributed/restart_agent.h). restart_agent:
  // this process supervises the job instead of being its rank 0 (a self-launched job with
  // max_restarts > 0, in the process the user started).
  int64_t max_restarts = 0;
  std::chrono::milliseconds restart_backoff{1000};
  bool restart_agent = false;
  std::vector<std::string> warnings;
};

// Why bfloat16 would be emulated on this machine's CPU ("" when it is native): no avx512_bf16 /
// amx_bf16 instructions, or ONEDNN_MAX_CPU_ISA holds oneDNN below them.
std::string bf16_emulated_because(const MachineFacts& facts);

// The fabric.fsdp.* keys as options (fabric.strategy: fsdp; tools/estimate_memory too).
strategies::FsdpOptions fsdp_options(const Config& config);

// Steps 1–6. Throws ConfigError (exit status 2) for impossible requests.
ResolvedSetup resolve_setup(const Config& config, const MachineFacts& facts);

// The Strategy (with its Precision) for a resolved setup.
std::unique_ptr<Strategy> build_strategy(const ResolvedSetup& setup);

// Applies the process-wide settings of steps 5 and 6 (deterministic algorithms, cuDNN, matmul
// precision, thread counts). Deterministic on CUDA also sets CUBLAS_WORKSPACE_CONFIG=:4096:8
// (unless already set), which cuBLAS needs for deterministic results.
void apply_global_settings(const ResolvedSetup& setup);

}  // namespace fabric

#endif  // FABRIC_CONNECTOR_H_
