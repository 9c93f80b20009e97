#include "fabric/connector.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "fabric/accelerators/device_info.h"
#include "fabric/connector_steps.h"
#include "fabric/environments/environments.h"

namespace fabric {
namespace {

using detail::plural;
using detail::resolve_ddp_options;
using detail::resolve_precision_options;
using detail::resolve_strategy_options;

// Step 1.
c10::DeviceType resolve_accelerator(const Config& c, const MachineFacts& m) {
  const std::string want = c.get_string("fabric.accelerator");
  const bool usable = m.cuda_compiled && m.libtorch_has_cuda && m.cuda_device_count > 0;
  if (want == "cpu") return c10::DeviceType::CPU;
  if (want == "auto") return usable ? c10::DeviceType::CUDA : c10::DeviceType::CPU;
  if (!m.cuda_compiled) {
    throw c.error_at("fabric.accelerator",
                     "'cuda' requested but this binary was built without CUDA (--config=cpu_only "
                     "or a CPU-only LibTorch): use fabric.accelerator=cpu or rebuild");
  }
  if (!m.libtorch_has_cuda) {
    throw c.error_at("fabric.accelerator",
                     "'cuda' requested but the loaded LibTorch has no CUDA support: install the "
                     "CUDA build of torch (tools/setup.sh) or use fabric.accelerator=cpu");
  }
  if (m.cuda_device_count == 0) {
    throw c.error_at("fabric.accelerator",
                     "'cuda' requested but no CUDA device is visible" +
                         (m.cuda_visible_devices.empty()
                              ? std::string()
                              : " (CUDA_VISIBLE_DEVICES='" + m.cuda_visible_devices + "')") +
                         ": use fabric.accelerator=cpu or auto, or run on a GPU machine");
  }
  return c10::DeviceType::CUDA;
}

// Step 2.
std::vector<torch::Device> resolve_devices(const Config& c, const MachineFacts& m,
                                           c10::DeviceType accelerator) {
  const DeviceRequest r = c.get_devices("fabric.devices");
  const std::string strategy = c.get_string("fabric.strategy");
  const bool data_parallel = strategy == "ddp" || strategy == "dp";
  if (accelerator == c10::DeviceType::CPU) {
    if (!r.ids.empty()) {
      throw c.error_at("fabric.devices",
                       "device ids apply to cuda only; on cpu give a process count (1)");
    }
    if (!r.is_auto && r.count == -1) {
      throw c.error_at("fabric.devices",
                       "-1 (every CUDA device) does not apply to cpu: give a process count >= 1, "
                       "or auto (2 processes with ddp, else 1)");
    }
    // auto with ddp or model_parallel: 2 processes, the smallest real job of either (on CPU
    // they are for trying the distributed path on any machine); otherwise 1.
    const int64_t n =
        r.is_auto ? (strategy == "ddp" || strategy == "model_parallel" ? 2 : 1) : r.count;
    return std::vector<torch::Device>(static_cast<size_t>(n), torch::Device(torch::kCPU));
  }
  std::vector<int64_t> ids;
  if (r.is_auto && !data_parallel) {
    ids = {0};
  } else if (!r.ids.empty()) {
    for (int64_t id : r.ids) {
      if (id >= m.cuda_device_count) {
        throw c.error_at("fabric.devices",
                         "device id " + std::to_string(id) + " does not exist: this machine has " +
                             plural(m.cuda_device_count, "CUDA device") + " (ids 0.." +
                             std::to_string(m.cuda_device_count - 1) + ")");
      }
    }
    ids = r.ids;
  } else {
    const int64_t n = r.is_auto || r.count == -1 ? m.cuda_device_count : r.count;
    if (n > m.cuda_device_count) {
      throw c.error_at("fabric.devices", plural(n, "device") + " requested but this machine has " +
                                             plural(m.cuda_device_count, "CUDA device"));
    }
    for (int64_t i = 0; i < n; ++i) ids.push_back(i);
  }
  // fabric.ddp.ranks_per_gpu: each GPU listed that many times, one process per entry.
  const int64_t per_gpu = c.get_int("fabric.ddp.ranks_per_gpu");
  std::vector<torch::Device> devices;
  for (int64_t id : ids)
    for (int64_t k = 0; k < per_gpu; ++k)
      devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(id));
  return devices;
}

// This process's device: its local rank's entry of the machine's devices. Under an external
// launcher with devices auto (or -1) on CUDA: the local rank's GPU, or, where the launcher gives
// each process its own GPU (a per-rank CUDA_VISIBLE_DEVICES, as SLURM's --gpus-per-task does),
// the one device this process sees.
torch::Device device_of_local_rank(const Config& c, const MachineFacts& m, const ResolvedSetup& s) {
  const int64_t local = s.environment->local_rank();
  if (local < static_cast<int64_t>(s.devices.size())) return s.devices[static_cast<size_t>(local)];
  if (s.accelerator != c10::DeviceType::CUDA) return torch::kCPU;
  const DeviceRequest request = c.get_devices("fabric.devices");
  const int64_t id = m.cuda_device_count == 1 ? 0 : local;
  if (s.environment->creates_processes_externally() && (request.is_auto || request.count == -1) &&
      id < m.cuda_device_count) {
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(id));
  }
  throw c.error_at("fabric.devices", "local rank " + std::to_string(local) + " has no device: " +
                                         plural(static_cast<int64_t>(s.devices.size()), "device") +
                                         " listed for this machine");
}

// Step 3.
// The job: which launch environment (and so the world), checked against fabric.num_nodes and a
// fabric.devices count the launcher contradicts.
void resolve_launch(const Config& c, const EnvGetter& env, const std::string& want,
                    ResolvedSetup& s) {
  // dp drives all its devices from one process; otherwise one process per device.
  s.environment =
      detect_environment(env, want == "dp" ? 1 : static_cast<int64_t>(s.devices.size()));
  const int64_t nodes = c.get_int("fabric.num_nodes");
  if (!s.environment->creates_processes_externally() && nodes > 1) {
    throw c.error_at("fabric.num_nodes",
                     plural(nodes, "node") +
                         " need an external launcher (torchrun, srun or mpirun) that "
                         "starts the processes on every node; or use 1");
  }
  // Under a launcher the processes are its: a count in fabric.devices that contradicts them would
  // otherwise be ignored in silence (or leave a rank without a device).
  const DeviceRequest request = c.get_devices("fabric.devices");
  const int64_t launched = s.environment->local_world_size();
  const auto asked = static_cast<int64_t>(s.devices.size());
  if (s.environment->creates_processes_externally() && want != "dp" && !request.is_auto &&
      request.count != -1 && launched > 0 && asked != launched) {
    throw c.error_at("fabric.devices",
                     c.get_text("fabric.devices") + " (" + plural(asked, "process") +
                         " on this machine) contradicts " + s.environment->name() +
                         ", which started " + std::to_string(launched) +
                         " here; use auto (the launcher decides) or " +
                         (request.ids.empty() ? std::to_string(launched)
                                              : "a list of " + std::to_string(launched) + " ids"));
  }
}

// fabric.max_restarts: whether this process is the restart agent, or a warning under a launcher
// that restarts ranks itself.
void resolve_restarts(const Config& c, const EnvGetter& env, ResolvedSetup& s) {
  s.max_restarts = c.get_int("fabric.max_restarts");
  s.restart_backoff = std::chrono::milliseconds(
      static_cast<int64_t>(c.get_double("fabric.restart_backoff_s") * 1000));
  if (s.max_restarts > 0 && s.environment->creates_processes_externally()) {
    s.warnings.push_back(c.origin("fabric.max_restarts") +
                         ": fabric.max_restarts applies to jobs Fabric launches itself; under " +
                         s.environment->name() +
                         " let the launcher restart the ranks (torchrun --max-restarts=N): a "
                         "restarted rank resumes from the newest complete checkpoint by itself");
  } else if (s.max_restarts > 0) {
    s.restart_agent = !env("FABRIC_LOCAL_RANK").has_value();  // not one of the agent's ranks
  }
}

void resolve_strategy(const Config& c, const MachineFacts& m, ResolvedSetup& s) {
  const std::string want = c.get_string("fabric.strategy");
  const EnvGetter env =
      m.environment ? m.environment
                    : [](const std::string&) -> std::optional<std::string> { return std::nullopt; };
  resolve_launch(c, env, want, s);
  resolve_restarts(c, env, s);
  const int64_t world = s.environment->world_size();
  if (want == "single_device" && world > 1) {
    throw c.error_at("fabric.strategy",
                     "'single_device' cannot run " + plural(world, "process") +
                         " (from fabric.devices or the launcher): use ddp or auto");
  }
  resolve_strategy_options(c, want, world, s);
  s.device = device_of_local_rank(c, m, s);
  resolve_ddp_options(c, s);
}

// Step 6. A positive count from an environment variable (parse_cpu_count).
std::optional<int64_t> positive_from_env(const EnvGetter& env, const std::string& name) {
  if (!env) return std::nullopt;
  const auto v = env(name);
  return v ? parse_cpu_count(*v) : std::nullopt;
}

void resolve_threads(const Config& c, const MachineFacts& m, ResolvedSetup& s) {
  const int64_t configured = c.get_int("fabric.num_threads");
  if (configured > 0) {
    s.num_threads = configured;
    s.threads_reason = "fabric.num_threads";
    return;
  }
  if (auto omp = positive_from_env(m.environment, "OMP_NUM_THREADS")) {
    s.num_threads = *omp;
    s.threads_reason = "OMP_NUM_THREADS";
    return;
  }
  int64_t cpus = m.cpu.usable();
  std::string cpus_from = "CPUs";
  if (auto budget = positive_from_env(m.environment, "FABRIC_CPUS")) {
    cpus = *budget;
    cpus_from = "CPUs (FABRIC_CPUS)";
  }
  if (cpus <= 0) return;  // unknown machine: LibTorch's own default stays
  // Processes of this job on this machine. dp drives every device from one process.
  const ClusterEnvironment& env = *s.environment;
  const int64_t nodes = std::max<int64_t>(c.get_int("fabric.num_nodes"), 1);
  int64_t local = env.local_world_size();
  if (local <= 0) local = (env.world_size() + nodes - 1) / nodes;
  if (s.strategy == StrategyKind::kDp) local = 1;
  // Self-launched children inherit one mask, so they share it. Ranks of an external launcher whose
  // mask is narrower than the machine were bound (srun --cpu-bind, mpirun --bind-to): they share
  // it with only as many ranks as the machine's CPUs allow (1 when bound to disjoint cores).
  int64_t sharing = local;
  if (env.creates_processes_externally() && m.cpu.affinity > 0 && m.cpu.online > m.cpu.affinity) {
    sharing =
        std::clamp<int64_t>((local * m.cpu.affinity + m.cpu.online - 1) / m.cpu.online, 1, local);
  }
  s.num_threads = std::max<int64_t>(cpus / sharing, 1);
  s.threads_reason = "auto: " + std::to_string(cpus) + " " + cpus_from + " / " +
                     plural(sharing, "process") + " sharing them";
}

}  // namespace

std::string bf16_emulated_because(const MachineFacts& m) {
  if (!m.cpu.native_bf16) return "this CPU has no avx512_bf16 or amx_bf16 instructions";
  if (m.environment) {
    std::string isa = m.environment("ONEDNN_MAX_CPU_ISA").value_or("");
    for (auto& ch : isa) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    for (const char* below :
         {"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI"}) {
      if (isa == below)
        return "ONEDNN_MAX_CPU_ISA=" + isa + " holds oneDNN below bf16 instructions";
    }
  }
  return "";
}

MachineFacts MachineFacts::query() {
  const RuntimeInfo info = query_runtime_info();
  MachineFacts m;
#ifdef FABRIC_WITH_CUDA
  m.cuda_compiled = true;
#endif
  m.libtorch_has_cuda = info.libtorch_has_cuda;
  m.cuda_device_count = static_cast<int64_t>(info.devices.size());
  m.cuda_bf16_supported = m.cuda_fp8_supported = m.cuda_fp8_rowwise_supported =
      !info.devices.empty();
  for (const auto& d : info.devices) {
    m.cuda_bf16_supported &= d.supports_bf16;
    m.cuda_fp8_supported &= d.capability_major * 10 + d.capability_minor >= 89;
    m.cuda_fp8_rowwise_supported &= d.capability_major * 10 + d.capability_minor >= 90;
  }
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) m.cuda_visible_devices = v;
  m.environment = process_environment();
  m.cpu = query_cpu_info();
  return m;
}

ResolvedSetup resolve_setup(const Config& c, const MachineFacts& m) {
  ResolvedSetup s;
  s.accelerator = resolve_accelerator(c, m);                 // 1
  s.devices = resolve_devices(c, m, s.accelerator);          // 2
  resolve_strategy(c, m, s);                                 // 3
  resolve_precision_options(c, m, s);                        // 4
  s.seed = static_cast<uint64_t>(c.get_int("fabric.seed"));  // 5
  s.deterministic = c.get_bool("fabric.deterministic");
  const std::string bench = c.get_string("fabric.cudnn_benchmark");
  s.cudnn_benchmark = bench == "auto" ? !s.deterministic : bench == "true";
  s.matmul_precision = c.get_string("fabric.matmul_precision");
  s.checkpoint_format = c.get_string("checkpoint.format");
  const std::string channels_last = c.get_string("fabric.channels_last");
  s.channels_last =
      channels_last == "auto" ? s.accelerator == c10::DeviceType::CUDA : channels_last == "true";
  if (s.channels_last && s.accelerator == c10::DeviceType::CPU) {
    // Reproduced in plain PyTorch 2.11 (docs/training.md): not ours to fix, ours to say.
    s.warnings.push_back(c.origin("fabric.channels_last") +
                         ": fabric.channels_last: on CPU, LibTorch 2.11's oneDNN AVX2 kernels can "
                         "write out of bounds in the weight gradient of small 1x1 convolutions; "
                         "use auto (CUDA only) unless measured safe and faster here");
  }
  s.scaler.init_scale(c.get_double("fabric.grad_scaler.init_scale"));
  s.scaler.growth_factor(c.get_double("fabric.grad_scaler.growth_factor"));
  s.scaler.backoff_factor(c.get_double("fabric.grad_scaler.backoff_factor"));
  s.scaler.growth_interval(c.get_int("fabric.grad_scaler.growth_interval"));
  s.ddp.sync_batchnorm = c.get_bool("fabric.sync_batchnorm");
  if (s.ddp.sync_batchnorm && s.strategy == StrategyKind::kFsdp) {
    throw c.error_at("fabric.sync_batchnorm",
                     "not supported with fabric.strategy: fsdp yet; use ddp (with "
                     "fabric.ddp.shard_optimizer_state to shard the optimizer state) or false");
  }
  // (Under other strategies the fsdp keys' warning names it.)
  if (c.get_bool("fabric.fsdp.cpu_offload") && s.precision == PrecisionMode::k16Mixed &&
      (s.strategy == StrategyKind::kFsdp || s.strategy == StrategyKind::kModelParallel)) {
    throw c.error_at("fabric.fsdp.cpu_offload",
                     "true is not supported with fabric.precision: 16-mixed (its loss scaler "
                     "checks the gradients on the device, the offloaded ones are in host "
                     "memory); use bf16-mixed or false");
  }
  if (s.ddp.sync_batchnorm && s.strategy != StrategyKind::kDdp) {
    s.warnings.push_back(c.origin("fabric.sync_batchnorm") +
                         ": fabric.sync_batchnorm: has no effect with a single process");
  }
  s.cuda_graphs = c.get_bool("fabric.cuda_graphs");
  std::string eager_because;
  if (!s.device.is_cuda()) {
    eager_because = "CUDA graphs need a CUDA device and this run is on " + s.device.str();
  } else if (s.strategy == StrategyKind::kDp || s.strategy == StrategyKind::kFsdp) {
    eager_because = std::string("capture under strategy ") + strategy_name(s.strategy) +
                    " is not implemented yet";
  } else if (s.strategy == StrategyKind::kDdp && s.ddp.cuda_with_gloo) {
    eager_because = "Gloo's collectives (fabric.ddp.cuda_backend) cannot be captured";
  } else if (s.strategy == StrategyKind::kDdp && s.ddp.sync_batchnorm) {
    eager_because = "SyncBatchNorm reads the global batch size on the host in every step";
  } else if (s.strategy == StrategyKind::kModelParallel &&
             s.model_parallel.pipeline_parallel_size > 1) {
    eager_because =
        "a pipeline's sends and receives between stages are not captured "
        "(fabric.model_parallel.pipeline_parallel_size > 1)";
  } else if (s.strategy == StrategyKind::kDdp && s.ddp.find_unused_parameters) {
    eager_because =
        "fabric.ddp.find_unused_parameters: a step whose set of gradients can change cannot be "
        "replayed";
  }
  if (s.cuda_graphs && !eager_because.empty()) {
    s.warnings.push_back(c.origin("fabric.cuda_graphs") +
                         ": fabric.cuda_graphs: steps run eagerly: " + eager_because);
    s.cuda_graphs = false;
  }
  s.memory_limit_gb = c.get_double("fabric.memory_limit_gb");
  s.tensor_memory_limit_gb = c.get_double("fabric.tensor_memory_limit_gb");
  s.empty_init = c.get_bool("fabric.empty_init");
  resolve_threads(c, m, s);  // 6
  return s;
}

}  // namespace fabric
