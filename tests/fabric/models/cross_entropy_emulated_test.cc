// fabric/models/kernels/cross_entropy.cu run on the CPU through tools/cuda_emu (CUDA threads as
// host threads): the fused softmax cross-entropy's loss and in-place gradient against a
// double-precision reference, bf16 and fp16, on the 16-byte path (vocab and row stride multiples
// of 8) and the element path (vocab 1003, a padded stride), with a target outside the vocabulary
// (loss NaN, gradient row zero) and rows past a padded stride left alone. It checks the kernel's
// indexing and its two-level block reduction; the device's arithmetic is gpt_cuda_test's (on a
// GPU). The kernel comes from tools/bazel/cuda.bzl's cuda_emulated_library.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "fabric/models/kernels/convert.cuh"
#include "fabric/models/kernels/cross_entropy.h"

namespace {

using fabric::kernels::from_float;
using fabric::kernels::LogitType;
using fabric::kernels::to_float;

template <typename T>
void check(int64_t rows, int64_t vocab, int64_t stride, LogitType type) {
  const double step = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;  // 16-bit spacing
  std::mt19937 gen(static_cast<unsigned>(vocab * 7 + stride));
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<T> logits(rows * stride + 8);
  // 16-byte aligned storage (std::vector's is at least 16 on this ABI).
  for (auto& v : logits) v = from_float<T>(normal(gen) * 3);
  const std::vector<T> before = logits;
  std::vector<int64_t> targets(rows);
  for (auto& t : targets) t = pick(gen);
  targets[1] = -1;  // outside the vocabulary
  std::vector<float> loss(rows, -1.f);
  const float scale = 0.25f;
  ASSERT_TRUE(fabric::kernels::softmax_cross_entropy_forward_backward(
                  logits.data(), targets.data(), loss.data(), rows, vocab, stride, scale, type,
                  nullptr) == 0)
      << "launch";
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = before.data() + r * stride;
    double m = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, static_cast<double>(to_float(x[j])));
    double sum = 0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(to_float(x[j]) - m);
    const double lse = m + std::log(sum);
    const bool valid = targets[r] >= 0;
    if (valid) {
      const double want = lse - to_float(x[targets[r]]);
      ASSERT_TRUE(std::fabs(loss[r] - want) <= 1e-4 * std::fabs(want) + 1e-5)
          << "loss[" << r << "] " << loss[r] << ", want " << want << " (vocab " << vocab << ")";
    } else {
      ASSERT_TRUE(std::isnan(loss[r]))
          << "loss[" << r << "] " << loss[r] << " for a target outside the vocabulary";
    }
    for (int64_t j = 0; j < vocab; ++j) {
      double want = valid ? std::exp(to_float(x[j]) - lse) - (j == targets[r] ? 1 : 0) : 0;
      want *= scale;
      const double got = to_float(logits[r * stride + j]);
      ASSERT_TRUE(std::fabs(got - want) <= step * std::fabs(want) + 1e-7)
          << "gradient[" << r << ", " << j << "] " << got << ", want " << want << " (vocab "
          << vocab << ")";
    }
    for (int64_t j = vocab; j < stride; ++j)
      ASSERT_TRUE(to_float(logits[r * stride + j]) == to_float(x[j]))
          << "padding [" << r << ", " << j << "] written";
  }
}

}  // namespace

TEST(CrossEntropyEmulatedTest, LossAndGradientMatchDoublePrecision) {
  check<__nv_bfloat16>(4, 1000, 1000, LogitType::kBFloat16);  // 16-byte loads
  check<__half>(4, 1000, 1008, LogitType::kFloat16);          // 16-byte loads, padded rows
  check<__nv_bfloat16>(3, 1003, 1003, LogitType::kBFloat16);  // element by element
  check<__half>(3, 1003, 1010, LogitType::kFloat16);
}
