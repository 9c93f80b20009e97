// libFuzzer harness (issue 20): the JPEG and PNG decoders must answer any bytes with an image or a
// fabric::Error, never a crash, a hang, another exception or a sanitizer report. Properties checked
// (a violation aborts): an error is one non-empty line; an image is [H, W, 3] uint8 with the size
// read_image_size() gave (or its DCT-scaled size) and every pixel readable; nothing above the pixel
// limit (4 megapixels here) is decoded.
// Input: the bytes of an image file (sniffed, as the dataset does).
//   bazel build --config=fuzz //tests/fuzz:image_fuzzer
//   bazel-bin/tests/fuzz/image_fuzzer -max_total_time=600 -rss_limit_mb=4096 \
//       tests/fuzz/corpus/image
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fabric/core/error.h"
#include "fabric/data/image_decode.h"

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "image_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}
constexpr int64_t kLimit = 4 << 20;
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  const auto* bytes = reinterpret_cast<const char*>(data);
  try {
    const fabric::ImageSize s = fabric::read_image_size(bytes, size, "input", kLimit);
    require(s.width > 0 && s.height > 0 && s.width * s.height <= kLimit, "size within the limit",
            std::to_string(s.width) + "x" + std::to_string(s.height));
    // Ask for a quarter of the size, so JPEG's DCT scaling is exercised too.
    const torch::Tensor image =
        fabric::decode_image(bytes, size, "input", s.width / 4 + 1, s.height / 4 + 1, kLimit);
    require(image.dim() == 3 && image.size(2) == 3 && image.scalar_type() == torch::kUInt8,
            "an RGB uint8 image", c10::str(image.sizes()));
    require(image.size(0) <= s.height && image.size(1) <= s.width, "no larger than the header",
            c10::str(image.sizes()));
    (void)image.sum().item<int64_t>();
  } catch (const fabric::Error& e) {
    const std::string what = e.what();
    require(!what.empty() && what.find('\n') == std::string::npos, "error is one line", what);
  }
  return 0;
}
