// libFuzzer harness (issue 67): the .safetensors reader must answer any bytes with tensors or a
// fabric::Error, never a crash, a hang, another exception or a sanitizer report. Properties checked
// (a violation aborts): an error is one non-empty line; the accepted tensors' bytes fit in the
// file (no size that wrapped around 64 bits), and every element of each can be read (summed).
// Input: the bytes of a .safetensors file (written to a temporary file: the reader maps files).
//   bazel build --config=fuzz //tests/fuzz:safetensors_fuzzer
//   bazel-bin/tests/fuzz/safetensors_fuzzer -max_total_time=600 -rss_limit_mb=4096 \
//     tests/fuzz/corpus/safetensors
#include <ATen/Parallel.h>
#include <torch/types.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/core/error.h"

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "safetensors_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

const std::filesystem::path& scratch() {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("safetensors_fuzzer_" + std::to_string(::getpid()) + ".safetensors");
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool once = [] {
    at::set_num_threads(1);
    std::atexit([] { std::filesystem::remove(scratch()); });
    return true;
  }();
  (void)once;
  {
    std::ofstream out(scratch(), std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  try {
    const fabric::SafetensorsFile file = fabric::load_safetensors(scratch());
    uint64_t bytes = 0;
    for (const auto& [name, t] : file.tensors) {
      bytes += t.nbytes();
      require(bytes <= size, "the tensors fit in the file", name);
      torch::Tensor v = t.is_complex() ? torch::view_as_real(t) : t;
      if (v.scalar_type() == torch::kFloat8_e4m3fn || v.scalar_type() == torch::kFloat8_e5m2 ||
          v.scalar_type() == torch::kFloat8_e8m0fnu || v.scalar_type() == torch::kUInt16 ||
          v.scalar_type() == torch::kUInt32 || v.scalar_type() == torch::kUInt64)
        v = v.view(torch::kUInt8);  // no sum kernel for these: read their bytes
      (void)v.to(torch::kDouble).sum().item<double>();
    }
  } catch (const fabric::Error& e) {
    const std::string what = e.what();
    require(!what.empty() && what.find('\n') == std::string::npos, "error is one line", what);
  }
  return 0;
}
