// bazel run //tools:env [-- [--json] [--config=FILE] [key=value ...]]
//
// Prints what this build is, what the loaded LibTorch can do on this machine (CUDA devices, cuDNN,
// NCCL, threads), the host, and what fabric::Fabric would set up here for the given config (the
// defaults without --config): launch environment, ranks, accelerator, devices, strategy and which
// precisions run on this device. The first thing to paste into a bug report.
//
// Flags:  --json          machine-readable output (one JSON object; "fabric_would_use" holds the
//                         resolution).
//         --config=FILE   resolve this config (looked up like the examples' --config).
//         key=value       config overrides, e.g. fabric.strategy=ddp.
//         --help          this text.
// Exit status: 0 report printed (also when the config cannot run here: the reason is shown);
//              2 usage error or a config that does not parse.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "tools/env_report.h"
#include "tools/env_resolve.h"

namespace {

constexpr const char* kUsage = "usage: env [--json] [--config=FILE] [key=value ...]\n";

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::string config;
  std::vector<std::string> overrides;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--help" || arg == "-h") {
      std::cout << kUsage << "  Prints the Fabric++ environment report.\n";
      return 0;
    } else if (arg.rfind("--config=", 0) == 0) {
      config = arg.substr(9);
    } else if (arg[0] != '-' && arg.find('=') != std::string::npos) {
      overrides.push_back(arg);
    } else {
      std::cerr << "env: unknown argument '" << arg << "'; " << kUsage;
      return 2;
    }
  }
  fabric::tools::FabricResolution resolution;
  try {
    resolution = fabric::tools::resolve_here(config, overrides, fabric::MachineFacts::query());
  } catch (const fabric::ConfigError& e) {
    std::cerr << e.what() << "\n";
    return 2;
  }
  const fabric::tools::EnvReport report = fabric::tools::collect_env_report();
  if (json) {
    auto j = fabric::tools::to_json(report);
    j["fabric_would_use"] = fabric::tools::to_json(resolution);
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fabric::tools::format_text(report) << fabric::tools::format_text(resolution);
  }
  return 0;
}
