// libFuzzer harness (issue 7): the YAML config loader with overrides must answer any input with a
// value or a fabric::ConfigError, never a crash, a hang, another exception or a sanitizer report.
// Properties checked (a violation aborts, which libFuzzer reports with the input): an error is one
// non-empty line; an accepted config written back with to_yaml() parses to the same hash.
// Input: YAML text, optionally followed by a NUL byte and newline-separated key=value overrides.
//   bazel build --config=fuzz //tests/fuzz:config_fuzzer
//   bazel-bin/tests/fuzz/config_fuzzer -max_total_time=60 tests/fuzz/corpus/config
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "fabric/config/config.h"
#include "fabric/core/error.h"

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "config_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}
}  // namespace

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
    const std::string written = config.to_yaml();
    const fabric::Config again = fabric::Config::parse(written, {}, schema, "written.yaml");
    require(again.hash() == config.hash(), "to_yaml() does not parse back to the same config",
            written);
  } catch (const fabric::ConfigError& e) {
    // The expected answer to bad input, as one line.
    const std::string message = e.what();
    require(!message.empty() && message.find('\n') == std::string::npos,
            "a ConfigError is not one non-empty line", message);
  }
  return 0;
}
