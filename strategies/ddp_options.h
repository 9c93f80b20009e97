// fabric::strategies::DdpOptions and FsdpOptions: the fabric.ddp.* and fabric.fsdp.* settings of
// the data-parallel strategies, parsed once by
// the Connector (fabric/connector.h) into typed values. Kept apart from ddp.h so that code which
// only describes a job (the Connector, tools/env_resolve) does not see the strategy's machinery.
#ifndef STRATEGIES_DDP_OPTIONS_H_
#define STRATEGIES_DDP_OPTIONS_H_

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fabric/distributed/process_group.h"

namespace fabric::strategies {

// fabric.ddp.comm_hook: the dtype gradients travel in. kFp16 / kBf16 divide each bucket by the
// world size, all-reduce it in half / bfloat16 and write it back in the gradients' dtype.
enum class CommHook { kNone, kFp16, kBf16 };
// "none" | "fp16" | "bf16", as in the config.
const char* comm_hook_name(CommHook hook);
// The config value's hook; nullopt for any other string.
std::optional<CommHook> parse_comm_hook(const std::string& name);

struct DdpOptions {
  double bucket_cap_mb = 25.0;           // fabric.ddp.bucket_cap_mb
  bool find_unused_parameters = false;   // fabric.ddp.find_unused_parameters
  bool broadcast_buffers = true;         // fabric.ddp.broadcast_buffers
  bool gradient_as_bucket_view = false;  // fabric.ddp.gradient_as_bucket_view
  bool static_graph = false;             // fabric.ddp.static_graph
  CommHook comm_hook = CommHook::kNone;  // fabric.ddp.comm_hook
  // fabric.ddp.shard_optimizer_state: ZeRO stage 1 (strategies/optimizer_shard.h): gradients
  // reduce-scattered after backward, each rank steps its 1/N of the parameters, then an
  // all-gather; the optimizer state takes 1/N of the memory.
  bool shard_optimizer_state = false;
  bool sync_batchnorm = false;  // fabric.sync_batchnorm
  bool cuda_with_gloo = false;  // Gloo instead of NCCL for CUDA tensors (ranks may share a GPU)
  // fabric.ddp.cpu_backend (fabric/distributed/process_group.h).
  distributed::CpuBackend cpu_backend = distributed::CpuBackend::kAuto;
  std::chrono::milliseconds timeout{300000};  // fabric.ddp.timeout_s
  // fabric.ddp.heartbeat_timeout_s (0: off). Jobs started by an external launcher: a rank that
  // stops beating for this long (killed, crashed, frozen) ends every other rank with an error
  // naming it (fabric/distributed/heartbeat.h). Self-launched jobs have the launcher for that.
  std::chrono::milliseconds heartbeat_timeout{5000};
  // fabric.ddp.debug_collectives: check through the store that every rank issues the same
  // collectives (kind, dtype, shape) in the same order; fail at the first divergence.
  bool debug_collectives = false;
};

// fabric.fsdp.sharding_strategy: what each rank keeps whole. kFullShard (ZeRO-3): parameters,
// gradients and optimizer state sharded, a unit's parameters gathered only while used;
// kShardGradOp (ZeRO-2): the same, but parameters stay gathered from their forward to their
// gradients' reduction; kNoShard: plain ddp.
enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard };
// "full_shard" | "shard_grad_op" | "no_shard", as in the config.
const char* sharding_strategy_name(ShardingStrategy strategy);
std::optional<ShardingStrategy> parse_sharding_strategy(const std::string& name);

// fabric.strategy: fsdp (strategies/fsdp.h). Process group settings come from DdpOptions.
struct FsdpOptions {
  ShardingStrategy sharding_strategy = ShardingStrategy::kFullShard;
  // fabric.fsdp.wrap_modules (comma-separated): module types that become units.
  std::vector<std::string> wrap_modules;
  // fabric.fsdp.min_unit_params: a submodule with at least this many parameters not in an inner
  // unit becomes a unit (0: off).
  int64_t min_unit_params = 1000000;
  // fabric.fsdp.reshard_after_forward: free a unit's gathered parameters when the forward moves
  // on to the next unit (auto: true under full_shard, false under shard_grad_op).
  bool reshard_after_forward = true;
  // fabric.fsdp.param_dtype / reduce_dtype: the dtype of the all-gathers for compute and of the
  // gradient reduce-scatters (nullopt, auto: the parameters' own).
  std::optional<c10::ScalarType> param_dtype;
  // fabric.fsdp.prefetch (nullopt, auto: when the process group's collectives are asynchronous:
  // NCCL, Gloo; the shared-memory backend computes them in the caller).
  std::optional<bool> prefetch;
  std::optional<c10::ScalarType> reduce_dtype;
  // fabric.fsdp.cpu_offload: the shards (the parameters' masters), their gradients and the
  // optimizer state in host memory (pinned under CUDA), the optimizer stepping there; the
  // device holds only the units gathered for compute.
  bool cpu_offload = false;
};

// fabric.strategy: model_parallel (strategies/model_parallel.h): tensor parallelism inside groups
// of tensor_parallel_size consecutive ranks, fsdp (FsdpOptions) over the data_parallel_size
// groups. Both resolved: their product is the world size.
struct ModelParallelOptions {
  int64_t tensor_parallel_size = 1;  // fabric.model_parallel.tensor_parallel_size
  int64_t data_parallel_size = 1;    // fabric.model_parallel.data_parallel_size
  // fabric.model_parallel.data_parallel_replicate_size: of the data-parallel ranks, how many
  // groups hold the same fsdp shards (HSDP); fsdp shards over data_parallel_size / this.
  int64_t replicate_size = 1;
  // fabric.model_parallel.sequence_parallel: activations cut along the sequence between the split
  // layers (fabric::nn::TensorParallelPlan::sequence_parallel).
  bool sequence_parallel = false;
  // fabric.model_parallel.pipeline_parallel_size: pipeline stages, the outermost mesh dimension
  // (the mesh is {pp, [dp_replicate], dp_shard, tp}); the fabric.pipeline.* keys say how a step
  // runs through them (fabric::distributed::PipelineRunner, Fabric::pipeline_backward).
  int64_t pipeline_parallel_size = 1;
  // fabric.model_parallel.context_parallel_size: ranks that split each sequence (ring attention;
  // the mesh's cp dimension, between dp_shard and tp; fsdp shards over dp_shard x cp).
  int64_t context_parallel_size = 1;
  std::string pipeline_schedule = "1f1b";  // fabric.pipeline.schedule
  int64_t micro_batches = 2;               // fabric.pipeline.micro_batches (0 resolved)
  int64_t virtual_stages = 1;              // fabric.pipeline.virtual_stages
};

}  // namespace fabric::strategies

#endif  // STRATEGIES_DDP_OPTIONS_H_
