#include "strategies/ddp_options.h"

namespace fabric::strategies {

const char* comm_hook_name(CommHook hook) {
  switch (hook) {
    case CommHook::kFp16:
      return "fp16";
    case CommHook::kBf16:
      return "bf16";
    case CommHook::kNone:
      break;
  }
  return "none";
}

std::optional<CommHook> parse_comm_hook(const std::string& name) {
  for (CommHook h : {CommHook::kNone, CommHook::kFp16, CommHook::kBf16})
    if (name == comm_hook_name(h)) return h;
  return std::nullopt;
}

const char* sharding_strategy_name(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kShardGradOp:
      return "shard_grad_op";
    case ShardingStrategy::kNoShard:
      return "no_shard";
    case ShardingStrategy::kFullShard:
      break;
  }
  return "full_shard";
}

std::optional<ShardingStrategy> parse_sharding_strategy(const std::string& name) {
  for (auto s :
       {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard})
    if (name == sharding_strategy_name(s)) return s;
  return std::nullopt;
}

}  // namespace fabric::strategies
