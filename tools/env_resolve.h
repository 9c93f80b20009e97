// What fabric::Fabric would set up on this machine for a config (defaults unless --config /
// key=value are given to //tools:env): the detected launch environment, ranks, accelerator,
// devices, strategy and precision, and for every precision whether it runs here. The answers come
// from the Connector itself (fabric/connector.h), so they cannot disagree with what a run does.
#ifndef TOOLS_ENV_RESOLVE_H_
#define TOOLS_ENV_RESOLVE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fabric/connector.h"

namespace fabric::tools {

struct FabricResolution {
  std::string config = "defaults";  // the config file, or "defaults"
  std::string error;                // why this config cannot run here ("" = it can)
  std::string environment;          // torchelastic, slurm, openmpi, mpich, env, local
  bool external_launcher = false;
  int64_t world_size = 1, global_rank = 0, local_rank = 0, node_rank = 0;
  std::string accelerator, device, strategy, precision;
  std::vector<std::string> devices;
  int64_t threads = 0;         // intra-/inter-op threads per process (0: LibTorch's default)
  std::string threads_reason;  // e.g. "auto: 2 CPUs / 2 processes sharing them"
  std::string cpu_bf16;        // "native (amx_bf16 avx512_bf16)" or "emulated (...)"
  // Every precision: "yes", "yes, runs as bf16-mixed" or "no: <reason>".
  std::vector<std::pair<std::string, std::string>> precisions;
  std::vector<std::string> warnings;
};

// Throws ConfigError for a config file or override that does not parse (the caller exits 2).
FabricResolution resolve_here(const std::string& config_file,
                              const std::vector<std::string>& overrides, const MachineFacts& facts);

std::string format_text(const FabricResolution& r);
nlohmann::json to_json(const FabricResolution& r);

}  // namespace fabric::tools

#endif  // TOOLS_ENV_RESOLVE_H_
