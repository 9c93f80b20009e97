// libFuzzer harness (issue 7): the YAML config loader with overrides must answer any input with a
// value or a fabric::ConfigError, never a crash, a hang, another exception or a sanitizer report.
// Input: YAML text, optionally followed by a NUL byte and newline-separated key=value overrides.
//   bazel build --config=fuzz //tests/fuzz:config_fuzzer
//   bazel-bin/tests/fuzz/config_fuzzer -max_total_time=60 tests/fuzz/corpus/config
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fabric/config.h"
#include "fabric/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string yaml = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != std::string::npos) {
    size_t start = nul + 1;
    while (start <= input.size()) {
      const size_t end = std::min(input.find('\n', start), input.size());
      if (end > start) overrides.push_back(input.substr(start, end - start));
      start = end + 1;
    }
  }
  static const fabric::ConfigSchema schema = fabric::training_schema();
  try {
    const fabric::Config config = fabric::Config::parse(yaml, overrides, schema, "fuzz.yaml");
    (void)config.to_yaml();
    (void)config.hash();
  } catch (const fabric::ConfigError&) {
    // The expected answer to bad input.
  }
  return 0;
}
