// libFuzzer harness (issue 20): the .npy and .npz readers must answer any bytes with arrays or a
// fabric::Error, never a crash, a hang, another exception or a sanitizer report. Properties checked
// (a violation aborts): an error is one non-empty line; every element of an accepted array can be
// read (summed).
// Input: the bytes of a .npy file, or of an .npz when they start with "PK".
//   bazel build --config=fuzz //tests/fuzz:npy_fuzzer
//   bazel-bin/tests/fuzz/npy_fuzzer -max_total_time=600 -rss_limit_mb=4096 tests/fuzz/corpus/npy
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "fabric/core/error.h"
#include "fabric/data/npy.h"

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "npy_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void read_all(const torch::Tensor& t) {
  torch::Tensor v = t.is_complex() ? torch::view_as_real(t) : t;
  (void)v.to(torch::kDouble).sum().item<double>();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  // A private copy the tensors may view (as they view a file mapping).
  auto bytes = std::make_shared<std::string>(reinterpret_cast<const char*>(data), size);
  try {
    if (size >= 2 && (*bytes)[0] == 'P' && (*bytes)[1] == 'K') {
      for (const auto& [name, t] : fabric::parse_npz(bytes->data(), bytes->size(), "input", bytes))
        read_all(t);
    } else {
      read_all(fabric::parse_npy(bytes->data(), bytes->size(), "input", bytes));
    }
  } catch (const fabric::Error& e) {
    const std::string what = e.what();
    require(!what.empty() && what.find('\n') == std::string::npos, "error is one line", what);
  }
  return 0;
}
