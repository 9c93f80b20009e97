// The report behind `bazel run //tools:env` (like `accelerate env`): what this build is, what the
// loaded LibTorch can do here, and the host. Text for people, JSON (--json) for tools and sweeps.
#ifndef TOOLS_ENV_REPORT_H_
#define TOOLS_ENV_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fabric/accelerators/device_info.h"
#include "fabric/core/build_info.h"

namespace fabric::tools {

struct HostInfo {
  std::string hostname;
  std::string os;      // PRETTY_NAME from /etc/os-release.
  std::string kernel;  // uname -r.
  std::string glibc;   // gnu_get_libc_version(): bundles need a node with glibc ≥ this build's.
  std::string cpu_model;
  int logical_cpus = 0;
  int64_t memory_bytes = 0;
};

HostInfo query_host_info();

struct EnvReport {
  BuildInfo build;
  RuntimeInfo runtime;
  HostInfo host;
  // Problems worth fixing before training (e.g. headers and library versions differ).
  std::vector<std::string> warnings;
};

EnvReport collect_env_report();

// Derives the warnings from the other fields (kept separate so tests can feed any facts).
std::vector<std::string> diagnose_environment(const BuildInfo& build, const RuntimeInfo& runtime);

std::string format_text(const EnvReport& report);
nlohmann::json to_json(const EnvReport& report);

}  // namespace fabric::tools

#endif  // TOOLS_ENV_REPORT_H_
