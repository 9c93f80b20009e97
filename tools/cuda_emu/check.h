// What the drivers of emulated kernel tests share (tools/bazel/cuda.bzl: cuda_emulated_test):
// EXPECT(cond, printf-format, ...) counts a failure and prints the first 20, and
// emulated_result(name) prints the count and gives main's exit status.
#ifndef TOOLS_CUDA_EMU_CHECK_H_
#define TOOLS_CUDA_EMU_CHECK_H_

#include <cstdio>

namespace fabric_emu {
inline int failures = 0;
}  // namespace fabric_emu

#define EXPECT(cond, ...)                                 \
  do {                                                    \
    if (!(cond) && fabric_emu::failures++ < 20) {         \
      std::printf("%s:%d: failed: ", __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                           \
      std::printf("\n");                                  \
    }                                                     \
  } while (0)

inline int emulated_result(const char* name) {
  std::printf("%s emulated: %d failures\n", name, fabric_emu::failures);
  return fabric_emu::failures == 0 ? 0 : 1;
}

#endif  // TOOLS_CUDA_EMU_CHECK_H_
