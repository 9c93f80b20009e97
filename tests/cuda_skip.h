// GPU tests (tag `gpu`): whether a CUDA device is usable, and SKIP_WITHOUT_CUDA() to skip a test
// with the reason when it is not (no device, or a --config=cpu_only build).
#ifndef TESTS_CUDA_SKIP_H_
#define TESTS_CUDA_SKIP_H_

#include <gtest/gtest.h>
#include <torch/cuda.h>

namespace fabric::testing {

inline bool has_cuda() {
#ifdef FABRIC_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

}  // namespace fabric::testing

#define SKIP_WITHOUT_CUDA()                                          \
  if (!fabric::testing::has_cuda()) {                                \
    GTEST_SKIP() << "no CUDA device (or a --config=cpu_only build)"; \
  }                                                                  \
  static_assert(true)

#endif  // TESTS_CUDA_SKIP_H_
