#include "fabric/connector.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <sstream>

#include "fabric/accelerators/device_info.h"
#include "fabric/core/suggest.h"
#include "fabric/environments/environments.h"

namespace fabric {
namespace {

// "a, b,,c" → {"a", "b", "c"}: the items of a comma-separated key, trimmed, empty ones dropped.
std::vector<std::string> comma_separated(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string plural(int64_t n, const std::string& word) {
  if (n == 1) return "1 " + word;
  return std::to_string(n) + " " + word + (word.back() == 's' ? "es" : "s");
}

// A choice key's value as its enum; the schema admits only the choices, so a miss is a bug here.
template <typename Enum>
Enum parsed(const Config& c, const std::string& key,
            std::optional<Enum> (*parse)(const std::string&)) {
  const std::string value = c.get_string(key);
  if (auto e = parse(value)) return *e;
  throw c.error_at(key, "'" + value + "' is not one of its choices (connector out of date)");
}

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

// fabric.ddp.cuda_backend and ranks_per_gpu, once the strategy is known: whether CUDA tensors go
// through Gloo instead of NCCL.
bool resolve_cuda_with_gloo(const Config& c, const ResolvedSetup& s) {
  const std::string backend = c.get_string("fabric.ddp.cuda_backend");
  const int64_t per_gpu = c.get_int("fabric.ddp.ranks_per_gpu");
  if (per_gpu > 1 && s.accelerator != c10::DeviceType::CUDA) {
    throw c.error_at("fabric.ddp.ranks_per_gpu",
                     std::to_string(per_gpu) +
                         " applies to cuda only; on cpu fabric.devices=N is the process count");
  }
  if (per_gpu > 1 && s.strategy == StrategyKind::kDp) {
    throw c.error_at("fabric.ddp.ranks_per_gpu",
                     std::to_string(per_gpu) +
                         " needs one process per rank: use fabric.strategy ddp or fsdp, not dp");
  }
  if (per_gpu > 1 && backend == "nccl") {
    throw c.error_at("fabric.ddp.cuda_backend",
                     "nccl cannot run " + std::to_string(per_gpu) +
                         " ranks on one GPU (fabric.ddp.ranks_per_gpu; NCCL refuses them: "
                         "\"Duplicate GPU detected\"): use gloo or auto, or ranks_per_gpu=1");
  }
  return backend == "gloo" || (backend == "auto" && per_gpu > 1);
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

// fabric.fsdp keys set by the user under another strategy configure nothing: one warning says so.
void warn_inert_fsdp_keys(const Config& c, const std::string& want, ResolvedSetup& s) {
  std::vector<std::string> inert;
  for (const auto& p : c.schema().paths())
    if (p.rfind("fabric.fsdp.", 0) == 0 && c.origin(p) != "default") inert.push_back(p);
  if (!inert.empty())
    s.warnings.push_back(
        c.origin(inert[0]) + ": " + join(inert) + (inert.size() == 1 ? ": has" : ": have") +
        " no effect under fabric.strategy: " + want + " (fabric.fsdp keys configure fsdp)");
}

// fabric.model_parallel.*: tensor_parallel_size (auto: the processes of one node) times
// data_parallel_size (auto: the rest) must be the world size; data_parallel_replicate_size
// divides data_parallel_size.
strategies::ModelParallelOptions resolve_model_parallel(const Config& c,
                                                        const ClusterEnvironment& env) {
  const char* tp_key = "fabric.model_parallel.tensor_parallel_size";
  const char* dp_key = "fabric.model_parallel.data_parallel_size";
  const int64_t world = env.world_size();
  strategies::ModelParallelOptions o;
  if (c.is_auto(tp_key)) {
    const int64_t local = env.local_world_size() > 0 ? env.local_world_size() : world;
    o.tensor_parallel_size = c.is_auto(dp_key) ? local : world / c.get_int(dp_key);
  } else {
    o.tensor_parallel_size = c.get_int(tp_key);
  }
  if (o.tensor_parallel_size < 1 || world % o.tensor_parallel_size != 0)
    throw c.error_at(tp_key, std::to_string(o.tensor_parallel_size) +
                                 " does not divide the world size " + std::to_string(world) +
                                 ": give a divisor of it (tensor-parallel partners are "
                                 "consecutive ranks)");
  o.data_parallel_size = world / o.tensor_parallel_size;
  o.sequence_parallel = c.get_bool("fabric.model_parallel.sequence_parallel");
  if (!c.is_auto(dp_key) && c.get_int(dp_key) != o.data_parallel_size)
    throw c.error_at(dp_key, std::to_string(c.get_int(dp_key)) + " x tensor_parallel_size " +
                                 std::to_string(o.tensor_parallel_size) +
                                 " is not the world size " + std::to_string(world) +
                                 ": make the product the world size, or set it to auto");
  const char* replicate_key = "fabric.model_parallel.data_parallel_replicate_size";
  o.replicate_size = c.get_int(replicate_key);
  if (o.data_parallel_size % o.replicate_size != 0)
    throw c.error_at(replicate_key, std::to_string(o.replicate_size) +
                                        " does not divide data_parallel_size " +
                                        std::to_string(o.data_parallel_size) +
                                        ": give a divisor of it (each copy is an fsdp group of "
                                        "data_parallel_size / this ranks)");
  return o;
}

// fabric.strategy: dp: one process; replicas on 2 or more CUDA devices, else single_device with a
// warning.
void resolve_dp(const Config& c, int64_t world, ResolvedSetup& s) {
  if (world > 1) {
    throw c.error_at("fabric.strategy", "'dp' runs one process, but the launcher started " +
                                            plural(world, "process") + ": use ddp");
  }
  if (s.accelerator == c10::DeviceType::CUDA && s.devices.size() >= 2) {
    s.strategy = StrategyKind::kDp;
  } else {
    s.warnings.push_back(
        c.origin("fabric.strategy") + ": fabric.strategy: dp needs 2 or more CUDA devices (have " +
        plural(static_cast<int64_t>(s.devices.size()), "device") + " on " +
        c10::DeviceTypeName(s.accelerator, true) + "); running single_device instead");
    s.devices.erase(s.devices.begin() + 1, s.devices.end());
  }
}

// The fabric.ddp.* keys (also the process group settings of fsdp).
void resolve_ddp_options(const Config& c, ResolvedSetup& s) {
  s.ddp.bucket_cap_mb = c.get_double("fabric.ddp.bucket_cap_mb");
  s.ddp.find_unused_parameters = c.get_bool("fabric.ddp.find_unused_parameters");
  s.ddp.broadcast_buffers = c.get_bool("fabric.ddp.broadcast_buffers");
  s.ddp.gradient_as_bucket_view = c.get_bool("fabric.ddp.gradient_as_bucket_view");
  if (s.ddp.gradient_as_bucket_view) {
    // torch::optim::Optimizer::zero_grad() calls detach_() on every gradient, which LibTorch
    // forbids on the bucket views this option makes the gradients into (it would abort mid-run).
    throw c.error_at("fabric.ddp.gradient_as_bucket_view",
                     "true is not supported: LibTorch's C++ Optimizer::zero_grad() detaches "
                     "gradients in place, which bucket views forbid; use false");
  }
  s.ddp.static_graph = c.get_bool("fabric.ddp.static_graph");
  s.ddp.comm_hook = parsed(c, "fabric.ddp.comm_hook", strategies::parse_comm_hook);
  s.ddp.shard_optimizer_state = c.get_bool("fabric.ddp.shard_optimizer_state");
  s.ddp.cpu_backend = parsed(c, "fabric.ddp.cpu_backend", distributed::parse_cpu_backend);
  s.ddp.cuda_with_gloo = resolve_cuda_with_gloo(c, s);
  s.ddp.timeout =
      std::chrono::milliseconds(static_cast<int64_t>(c.get_double("fabric.ddp.timeout_s") * 1000));
  s.ddp.debug_collectives = c.get_bool("fabric.ddp.debug_collectives");
  s.ddp.heartbeat_timeout = std::chrono::milliseconds(
      static_cast<int64_t>(c.get_double("fabric.ddp.heartbeat_timeout_s") * 1000));
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
  s.strategy = want == "ddp" || (want == "auto" && world > 1) ? StrategyKind::kDdp
                                                              : StrategyKind::kSingleDevice;
  if (want == "fsdp") {
    s.fsdp = fsdp_options(c);
    // no_shard keeps everything whole on every rank: that is ddp.
    s.strategy = s.fsdp.sharding_strategy == strategies::ShardingStrategy::kNoShard
                     ? StrategyKind::kDdp
                     : StrategyKind::kFsdp;
  } else if (want == "model_parallel") {
    s.fsdp = fsdp_options(c);
    if (s.fsdp.sharding_strategy == strategies::ShardingStrategy::kNoShard)
      throw c.error_at("fabric.fsdp.sharding_strategy",
                       "no_shard is not supported under fabric.strategy: model_parallel (its "
                       "data-parallel ranks are fsdp's); use full_shard or shard_grad_op");
    s.model_parallel = resolve_model_parallel(c, *s.environment);
    s.strategy = StrategyKind::kModelParallel;
  } else {
    warn_inert_fsdp_keys(c, want, s);
  }
  if (want != "model_parallel") {
    for (const char* key :
         {"fabric.model_parallel.tensor_parallel_size", "fabric.model_parallel.data_parallel_size",
          "fabric.model_parallel.data_parallel_replicate_size",
          "fabric.model_parallel.sequence_parallel"})
      if (c.origin(key) != "default")
        s.warnings.push_back(c.origin(key) + ": " + key +
                             ": has no effect under fabric.strategy: " + want +
                             " (it configures model_parallel)");
  }
  if (want == "dp") resolve_dp(c, world, s);
  s.device = device_of_local_rank(c, m, s);
  resolve_ddp_options(c, s);
}

// Step 4.
PrecisionMode resolve_precision(const Config& c, const MachineFacts& m, c10::DeviceType accelerator,
                                std::vector<std::string>& warnings) {
  PrecisionMode p = parse_precision(c.get_string("fabric.precision"));
  if (accelerator == c10::DeviceType::CPU) {
    if (p == PrecisionMode::k16True) {
      throw c.error_at("fabric.precision",
                       "'16-true' is not supported on CPU (float16 CPU kernels are slow and "
                       "incomplete): use bf16-true or bf16-mixed, or run on cuda");
    }
    const std::string emulated = bf16_emulated_because(m);
    if (p == PrecisionMode::k16Mixed) {
      if (emulated.empty()) {
        warnings.push_back(c.origin("fabric.precision") +
                           ": fabric.precision: 16-mixed is not supported on CPU; using bf16-mixed "
                           "(this CPU computes bf16 natively: " +
                           m.cpu.bf16_flags + ")");
        p = PrecisionMode::kBf16Mixed;
      } else {
        warnings.push_back(c.origin("fabric.precision") +
                           ": fabric.precision: 16-mixed is not supported on CPU and bf16 would be "
                           "emulated (" +
                           emulated +
                           "; several times slower than float32); using 32-true. "
                           "fabric.precision=bf16-mixed forces bf16");
        p = PrecisionMode::k32True;
      }
    } else if ((p == PrecisionMode::kBf16Mixed || p == PrecisionMode::kBf16True ||
                p == PrecisionMode::kFp8Mixed) &&
               !emulated.empty()) {
      warnings.push_back(c.origin("fabric.precision") + ": fabric.precision: " + to_string(p) +
                         " is emulated on this CPU (" + emulated +
                         "): expect it several times slower than 32-true");
    }
    if (p == PrecisionMode::kFp8Mixed)
      warnings.push_back(c.origin("fabric.precision") +
                         ": fabric.precision: fp8-mixed on CPU runs its float8 GEMMs through "
                         "LibTorch's CPU _scaled_mm: for checking numerics, not for speed");
  } else if (p == PrecisionMode::kFp8Mixed && !m.cuda_fp8_supported) {
    throw c.error_at("fabric.precision",
                     "'fp8-mixed' needs GPUs of compute capability >= 8.9 (Ada, Hopper or "
                     "newer) for float8 GEMMs: use bf16-mixed");
  } else if ((p == PrecisionMode::kBf16Mixed || p == PrecisionMode::kBf16True) &&
             !m.cuda_bf16_supported) {
    throw c.error_at("fabric.precision",
                     "'" + to_string(p) +
                         "' needs a GPU with bfloat16 support (compute capability "
                         ">= 8.0): use 16-mixed");
  }
  return p;
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

strategies::FsdpOptions fsdp_options(const Config& c) {
  strategies::FsdpOptions o;
  o.sharding_strategy =
      parsed(c, "fabric.fsdp.sharding_strategy", strategies::parse_sharding_strategy);
  o.min_unit_params = c.get_int("fabric.fsdp.min_unit_params");
  const std::string reshard = c.get_string("fabric.fsdp.reshard_after_forward");
  o.reshard_after_forward = reshard == "auto"
                                ? o.sharding_strategy == strategies::ShardingStrategy::kFullShard
                                : reshard == "true";
  auto wire = [&c](const char* key) -> std::optional<c10::ScalarType> {
    const std::string v = c.get_string(key);
    if (v == "bf16") return c10::kBFloat16;
    if (v == "fp16") return c10::kHalf;
    if (v == "fp32") return c10::kFloat;
    return std::nullopt;  // auto
  };
  const std::string prefetch = c.get_string("fabric.fsdp.prefetch");
  o.prefetch = prefetch == "auto" ? std::nullopt : std::optional<bool>(prefetch == "true");
  o.param_dtype = wire("fabric.fsdp.param_dtype");
  o.reduce_dtype = wire("fabric.fsdp.reduce_dtype");
  o.wrap_modules = comma_separated(c.get_string("fabric.fsdp.wrap_modules"));
  return o;
}

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
  m.cuda_bf16_supported = m.cuda_fp8_supported = !info.devices.empty();
  for (const auto& d : info.devices) {
    m.cuda_bf16_supported &= d.supports_bf16;
    m.cuda_fp8_supported &= d.capability_major * 10 + d.capability_minor >= 89;
  }
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) m.cuda_visible_devices = v;
  m.environment = process_environment();
  m.cpu = query_cpu_info();
  return m;
}

ResolvedSetup resolve_setup(const Config& c, const MachineFacts& m) {
  ResolvedSetup s;
  s.accelerator = resolve_accelerator(c, m);                         // 1
  s.devices = resolve_devices(c, m, s.accelerator);                  // 2
  resolve_strategy(c, m, s);                                         // 3
  s.precision = resolve_precision(c, m, s.accelerator, s.warnings);  // 4
  {
    s.fp8_exclude = comma_separated(c.get_string("fabric.fp8.exclude_modules"));
    if (!s.fp8_exclude.empty() && s.precision != PrecisionMode::kFp8Mixed)
      s.warnings.push_back(c.origin("fabric.fp8.exclude_modules") +
                           ": fabric.fp8.exclude_modules: has no effect under fabric.precision: " +
                           to_string(s.precision) + " (it configures fp8-mixed)");
  }
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
