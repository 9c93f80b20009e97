// libFuzzer harness: the sweep file parser (tools/sweep/spec.h) must answer any text with a
// SweepSpec or a fabric::ConfigError, never a crash, a hang, another exception or a sanitizer
// report. Properties checked (a violation aborts, which libFuzzer reports with the input): an
// error is one non-empty line naming the file; an accepted sweep expands to at most 100,000 runs
// with distinct ids, none longer than 120 characters.
//   bazel build --config=fuzz //tests/fuzz:sweep_fuzzer
//   bazel-bin/tests/fuzz/sweep_fuzzer -max_total_time=60 tests/fuzz/corpus/sweep
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "fabric/core/error.h"
#include "tools/sweep/spec.h"

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "sweep_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string yaml(reinterpret_cast<const char*>(data), size);
  try {
    const fabric::sweep::SweepSpec spec = fabric::sweep::parse_sweep(yaml, "s.yaml");
    require(spec.runs.size() <= 100000, "more than 100,000 runs", std::to_string(spec.runs.size()));
    std::set<std::string> ids;
    for (const auto& run : spec.runs) {
      require(ids.insert(run.id).second, "two runs share an id", run.id);
      require(!run.id.empty() && run.id.size() <= 120, "a run id is empty or too long", run.id);
    }
  } catch (const fabric::ConfigError& e) {
    const std::string message = e.what();
    require(!message.empty() && message.find('\n') == std::string::npos &&
                message.rfind("s.yaml", 0) == 0,
            "a ConfigError is not one line naming the file", message);
  }
  return 0;
}
