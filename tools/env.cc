// bazel run //tools:env [-- --json]
//
// Prints what this build is, what the loaded LibTorch can do on this machine (CUDA devices, cuDNN,
// NCCL, threads) and the host: the first thing to paste into a bug report.
//
// Flags:  --json   machine-readable output (one JSON object).
//         --help   this text.
// Exit status: 0 report printed; 2 usage error.
#include <cstring>
#include <iostream>

#include "tools/env_report.h"

int main(int argc, char** argv) {
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::cout << "usage: env [--json]\n  Prints the Fabric++ environment report.\n";
      return 0;
    } else {
      std::cerr << "env: unknown argument '" << argv[i] << "'; usage: env [--json]\n";
      return 2;
    }
  }
  const fabric::tools::EnvReport report = fabric::tools::collect_env_report();
  if (json) {
    std::cout << fabric::tools::to_json(report).dump(2) << "\n";
  } else {
    std::cout << fabric::tools::format_text(report);
  }
  return 0;
}
