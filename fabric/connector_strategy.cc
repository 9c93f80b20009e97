// The connector's strategy step (fabric/connector.h, step 3): which strategy, and its options.
#include <functional>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/connector.h"
#include "fabric/connector_steps.h"
#include "fabric/core/suggest.h"
#include "fabric/distributed/pipeline_schedule.h"

namespace fabric {
namespace detail {

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

}  // namespace detail

namespace {

using detail::comma_separated;
using detail::parsed;
using detail::plural;

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

// Keys `applies` accepts, set by the user, that configure nothing under fabric.strategy `want`:
// one warning names them and says what they configure (`what`).
void warn_inert_keys(const Config& c, const std::function<bool(const std::string&)>& applies,
                     const std::string& want, const std::string& what, ResolvedSetup& s) {
  std::vector<std::string> inert;
  for (const auto& p : c.schema().paths())
    if (applies(p) && c.origin(p) != "default") inert.push_back(p);
  if (!inert.empty())
    s.warnings.push_back(c.origin(inert[0]) + ": " + join(inert) +
                         (inert.size() == 1 ? ": has" : ": have") +
                         " no effect under fabric.strategy: " + want + " (" + what + ")");
}

// fabric.fsdp keys under another strategy.
void warn_inert_fsdp_keys(const Config& c, const std::string& want, ResolvedSetup& s) {
  warn_inert_keys(
      c, [](const std::string& p) { return p.rfind("fabric.fsdp.", 0) == 0; }, want,
      "fabric.fsdp keys configure fsdp", s);
}

// DDP's own gradient and optimizer settings under fsdp or model_parallel (fabric.ddp's process
// group settings, timeouts, backends and checks, apply to them too).
void warn_inert_ddp_keys(const Config& c, const std::string& want, ResolvedSetup& s) {
  static const std::set<std::string> ddp_only = {
      "fabric.ddp.bucket_cap_mb",        "fabric.ddp.find_unused_parameters",
      "fabric.ddp.broadcast_buffers",    "fabric.ddp.gradient_as_bucket_view",
      "fabric.ddp.static_graph",         "fabric.ddp.comm_hook",
      "fabric.ddp.shard_optimizer_state"};
  warn_inert_keys(
      c, [](const std::string& p) { return ddp_only.count(p) > 0; }, want,
      "fabric.ddp's gradient and ZeRO-1 keys configure ddp; " + want +
          " shards gradients and optimizer state itself",
      s);
}

// fabric.pipeline.*: the schedule's requirements (fabric::distributed::pipeline_actions) checked
// before any process starts, each failure at the key to change.
void resolve_pipeline(const Config& c, strategies::ModelParallelOptions& o) {
  const int64_t pp = o.pipeline_parallel_size;
  o.pipeline_schedule = c.get_string("fabric.pipeline.schedule");
  o.virtual_stages = c.get_int("fabric.pipeline.virtual_stages");
  o.micro_batches = c.get_int("fabric.pipeline.micro_batches");
  o.micro_batches = distributed::resolve_micro_batches(o.micro_batches, pp, o.virtual_stages);
  if (o.virtual_stages > 1 && o.pipeline_schedule != "interleaved_1f1b")
    throw c.error_at("fabric.pipeline.virtual_stages",
                     std::to_string(o.virtual_stages) +
                         " needs fabric.pipeline.schedule: "
                         "interleaved_1f1b, not " +
                         o.pipeline_schedule + "; set that schedule, or virtual_stages: 1");
  try {
    distributed::pipeline_actions(distributed::parse_pipeline_schedule(o.pipeline_schedule), 0, pp,
                                  o.micro_batches, o.virtual_stages);
  } catch (const Error& e) {
    throw c.error_at("fabric.pipeline.micro_batches", e.what());
  }
}

// fabric.model_parallel.*: tensor_parallel_size (auto: the processes of one node) times
// data_parallel_size (auto: the rest) must be the world size; data_parallel_replicate_size
// divides data_parallel_size.
strategies::ModelParallelOptions resolve_model_parallel(const Config& c,
                                                        const ClusterEnvironment& env) {
  const char* tp_key = "fabric.model_parallel.tensor_parallel_size";
  const char* dp_key = "fabric.model_parallel.data_parallel_size";
  const char* pp_key = "fabric.model_parallel.pipeline_parallel_size";
  strategies::ModelParallelOptions o;
  const char* cp_key = "fabric.model_parallel.context_parallel_size";
  o.pipeline_parallel_size = c.get_int(pp_key);
  o.context_parallel_size = c.get_int(cp_key);
  if (env.world_size() % o.pipeline_parallel_size != 0)
    throw c.error_at(pp_key, std::to_string(o.pipeline_parallel_size) +
                                 " does not divide the world size " +
                                 std::to_string(env.world_size()) +
                                 ": give a divisor of it (each stage is world size / this ranks)");
  if (env.world_size() / o.pipeline_parallel_size % o.context_parallel_size != 0)
    throw c.error_at(
        cp_key, std::to_string(o.context_parallel_size) + " does not divide" +
                    (o.pipeline_parallel_size == 1 ? " the world size "
                                                   : " world size / pipeline_parallel_size = ") +
                    std::to_string(env.world_size() / o.pipeline_parallel_size) +
                    ": give a divisor of it");
  // The ranks that split the rest: dp x tp of them, for each pipeline stage and cp rank.
  const int64_t world = env.world_size() / o.pipeline_parallel_size / o.context_parallel_size;
  const std::string of_world =
      o.pipeline_parallel_size == 1 && o.context_parallel_size == 1
          ? " the world size " + std::to_string(world)
          : " world size / (pipeline_parallel_size x context_parallel_size) = " +
                std::to_string(world);
  if (c.is_auto(tp_key)) {
    const int64_t local = env.local_world_size() > 0 ? env.local_world_size() : world;
    if (!c.is_auto(dp_key) && world % c.get_int(dp_key) != 0)
      throw c.error_at(dp_key, std::to_string(c.get_int(dp_key)) + " does not divide" + of_world +
                                   ": give a divisor of it, or set it to auto");
    o.tensor_parallel_size = c.is_auto(dp_key) ? std::gcd(local, world) : world / c.get_int(dp_key);
  } else {
    o.tensor_parallel_size = c.get_int(tp_key);
  }
  if (o.tensor_parallel_size < 1 || world % o.tensor_parallel_size != 0)
    throw c.error_at(tp_key, std::to_string(o.tensor_parallel_size) + " does not divide" +
                                 of_world +
                                 ": give a divisor of it (tensor-parallel partners are "
                                 "consecutive ranks)");
  o.data_parallel_size = world / o.tensor_parallel_size;
  // At pp 1 the pipeline keys have no effect (a warning below), so their values are not checked.
  if (o.pipeline_parallel_size > 1) resolve_pipeline(c, o);
  o.sequence_parallel = c.get_bool("fabric.model_parallel.sequence_parallel");
  if (!c.is_auto(dp_key) && c.get_int(dp_key) != o.data_parallel_size)
    throw c.error_at(dp_key, std::to_string(c.get_int(dp_key)) + " x tensor_parallel_size " +
                                 std::to_string(o.tensor_parallel_size) + " is not" + of_world +
                                 ": make the product " +
                                 (world == env.world_size() ? "the world size" : "that") +
                                 ", or set it to auto");
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

}  // namespace

namespace detail {

void resolve_strategy_options(const Config& c, const std::string& want, int64_t world,
                              ResolvedSetup& s) {
  s.strategy = want == "ddp" || (want == "auto" && world > 1) ? StrategyKind::kDdp
                                                              : StrategyKind::kSingleDevice;
  if (want == "fsdp") {
    s.fsdp = fsdp_options(c);
    // no_shard keeps everything whole on every rank: that is ddp.
    s.strategy = s.fsdp.sharding_strategy == strategies::ShardingStrategy::kNoShard
                     ? StrategyKind::kDdp
                     : StrategyKind::kFsdp;
    if (s.strategy == StrategyKind::kFsdp) warn_inert_ddp_keys(c, want, s);  // no_shard: ddp
  } else if (want == "model_parallel") {
    s.fsdp = fsdp_options(c);
    if (s.fsdp.sharding_strategy == strategies::ShardingStrategy::kNoShard)
      throw c.error_at("fabric.fsdp.sharding_strategy",
                       "no_shard is not supported under fabric.strategy: model_parallel (its "
                       "data-parallel ranks are fsdp's); use full_shard or shard_grad_op");
    s.model_parallel = resolve_model_parallel(c, *s.environment);
    s.strategy = StrategyKind::kModelParallel;
    warn_inert_ddp_keys(c, want, s);
    if (s.model_parallel.pipeline_parallel_size == 1)
      for (const char* key : {"fabric.pipeline.schedule", "fabric.pipeline.micro_batches",
                              "fabric.pipeline.virtual_stages"})
        if (c.origin(key) != "default")
          s.warnings.push_back(c.origin(key) + ": " + key +
                               ": has no effect at fabric.model_parallel.pipeline_parallel_size 1");
  } else {
    warn_inert_fsdp_keys(c, want, s);
  }
  if (want != "model_parallel") {
    for (const char* key :
         {"fabric.model_parallel.tensor_parallel_size", "fabric.model_parallel.data_parallel_size",
          "fabric.model_parallel.data_parallel_replicate_size",
          "fabric.model_parallel.sequence_parallel", "fabric.model_parallel.pipeline_parallel_size",
          "fabric.model_parallel.context_parallel_size", "fabric.pipeline.schedule",
          "fabric.pipeline.micro_batches", "fabric.pipeline.virtual_stages"})
      if (c.origin(key) != "default")
        s.warnings.push_back(c.origin(key) + ": " + key +
                             ": has no effect under fabric.strategy: " + want +
                             " (it configures model_parallel)");
  }
  if (want == "dp") resolve_dp(c, world, s);
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

}  // namespace detail

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
  o.cpu_offload = c.get_bool("fabric.fsdp.cpu_offload");
  return o;
}

}  // namespace fabric
