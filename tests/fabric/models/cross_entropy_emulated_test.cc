// fabric/models/kernels/cross_entropy.cu run on the CPU through tools/cuda_emu (CUDA threads as
// host threads): the fused softmax cross-entropy's loss and in-place gradient against a
// double-precision reference of at::cross_entropy_loss with its default ignore_index (-100), bf16
// and fp16, on the 16-byte path (vocab and row stride multiples of 8) and the element path (vocab
// 1003, a padded stride). Batches with no target ignored, some ignored and all ignored: an ignored
// row has loss 0 and a zero gradient, the others' gradients are divided by the count of rows not
// ignored (read by the kernel from memory), and Σ loss / count, as fused_cross_entropy.cc forms
// it, is torch's mean over those rows (NaN when all are ignored, as torch). A target outside the
// vocabulary other than -100 gives loss NaN and a zero gradient row, and rows past a padded stride
// are left alone. It checks the kernel's indexing and its two-level block reduction; the device's
// arithmetic is gpt_cuda_test's (on a GPU). The kernel comes from tools/bazel/cuda.bzl's
// cuda_emulated_library.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

#include "fabric/models/kernels/convert.cuh"
#include "fabric/models/kernels/cross_entropy.h"

namespace {

using fabric::kernels::from_float;
using fabric::kernels::LogitType;
using fabric::kernels::to_float;

constexpr int64_t kIgnoreIndex = -100;  // torch's default ignore_index

// Runs the kernel on `rows` random rows whose targets are random ids except those set by
// `special` ({row, target}: -100 ignored, others outside the vocabulary), and compares each row's
// loss and gradient, and the mean loss, with a double-precision reference.
template <typename T>
void check(int64_t rows, int64_t vocab, int64_t stride, LogitType type,
           const std::vector<std::pair<int64_t, int64_t>>& special) {
  SCOPED_TRACE(::testing::Message() << "rows " << rows << ", vocab " << vocab << ", stride "
                                    << stride << ", " << special.size() << " special targets");
  const double step = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;  // 16-bit spacing
  std::mt19937 gen(static_cast<unsigned>(vocab * 7 + stride + rows));
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
  std::vector<T> logits(rows * stride + 8);
  // 16-byte aligned storage (std::vector's is at least 16 on this ABI).
  for (auto& v : logits) v = from_float<T>(normal(gen) * 3);
  const std::vector<T> before = logits;
  std::vector<int64_t> targets(rows);
  for (auto& t : targets) t = pick(gen);
  for (const auto& [row, target] : special) targets[row] = target;
  // The caller's count (fused_cross_entropy.cc: (t != -100).sum() on the device).
  const int64_t count =
      std::count_if(targets.begin(), targets.end(), [](int64_t t) { return t != kIgnoreIndex; });
  std::vector<float> loss(rows, -1.f);
  ASSERT_TRUE(fabric::kernels::softmax_cross_entropy_forward_backward(
                  logits.data(), targets.data(), loss.data(), rows, vocab, stride, &count,
                  kIgnoreIndex, type, nullptr) == 0)
      << "launch";
  double want_sum = 0;  // the reference's Σ over the rows that are not ignored
  float sum = 0;        // fused_cross_entropy.cc's loss.sum(), in float
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = before.data() + r * stride;
    double m = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) m = std::max(m, static_cast<double>(to_float(x[j])));
    double sum_exp = 0;
    for (int64_t j = 0; j < vocab; ++j) sum_exp += std::exp(to_float(x[j]) - m);
    const double lse = m + std::log(sum_exp);
    const bool ignored = targets[r] == kIgnoreIndex;
    const bool valid = targets[r] >= 0 && targets[r] < vocab;
    sum += loss[r];
    if (valid) {
      const double want = lse - to_float(x[targets[r]]);
      want_sum += want;
      ASSERT_TRUE(std::fabs(loss[r] - want) <= 1e-4 * std::fabs(want) + 1e-5)
          << "loss[" << r << "] " << loss[r] << ", want " << want;
    } else if (ignored) {
      ASSERT_TRUE(loss[r] == 0.f) << "loss[" << r << "] " << loss[r] << " for an ignored target";
    } else {
      want_sum = NAN;
      ASSERT_TRUE(std::isnan(loss[r]))
          << "loss[" << r << "] " << loss[r] << " for a target outside the vocabulary";
    }
    for (int64_t j = 0; j < vocab; ++j) {
      const double want =
          valid ? (std::exp(to_float(x[j]) - lse) - (j == targets[r] ? 1 : 0)) / count : 0;
      const double got = to_float(logits[r * stride + j]);
      ASSERT_TRUE(std::fabs(got - want) <= step * std::fabs(want) + 1e-7)
          << "gradient[" << r << ", " << j << "] " << got << ", want " << want;
    }
    for (int64_t j = vocab; j < stride; ++j)
      ASSERT_TRUE(to_float(logits[r * stride + j]) == to_float(x[j]))
          << "padding [" << r << ", " << j << "] written";
  }
  // at::cross_entropy_loss's mean: Σ over the rows not ignored / their count, 0 / 0 = NaN when
  // every row is ignored.
  const double want_mean = want_sum / static_cast<double>(count);
  const float mean = sum / static_cast<float>(count);
  if (std::isnan(want_mean)) {
    EXPECT_TRUE(std::isnan(mean)) << "mean loss " << mean << ", want NaN";
  } else {
    EXPECT_NEAR(mean, want_mean, 1e-4 * std::fabs(want_mean) + 1e-5);
  }
}

}  // namespace

TEST(CrossEntropyEmulatedTest, LossAndGradientMatchDoublePrecision) {
  check<__nv_bfloat16>(4, 1000, 1000, LogitType::kBFloat16, {});  // 16-byte loads
  check<__half>(4, 1000, 1008, LogitType::kFloat16, {});          // 16-byte loads, padded rows
  check<__nv_bfloat16>(3, 1003, 1003, LogitType::kBFloat16, {});  // element by element
  check<__half>(3, 1003, 1010, LogitType::kFloat16, {});
}

TEST(CrossEntropyEmulatedTest, ATargetOutsideTheVocabularyGivesNaN) {
  check<__nv_bfloat16>(4, 1000, 1000, LogitType::kBFloat16, {{1, -1}});
  check<__half>(3, 1003, 1010, LogitType::kFloat16, {{1, 1003}});
  // With -100 among the rows too: the count leaves out only the -100 row, the mean is NaN.
  check<__nv_bfloat16>(5, 1000, 1008, LogitType::kBFloat16, {{0, kIgnoreIndex}, {3, -1}});
}

TEST(CrossEntropyEmulatedTest, TargetsMinus100AreIgnoredAsTorchIgnoresThem) {
  // Some rows ignored, among them the first and the last, on both load paths and both types.
  check<__half>(6, 1000, 1008, LogitType::kFloat16, {{0, kIgnoreIndex}, {2, kIgnoreIndex}});
  check<__nv_bfloat16>(5, 1003, 1003, LogitType::kBFloat16,
                       {{1, kIgnoreIndex}, {2, kIgnoreIndex}, {4, kIgnoreIndex}});
  check<__half>(3, 1003, 1010, LogitType::kFloat16, {{2, kIgnoreIndex}});
  // Every row ignored: losses 0, gradients 0, the mean NaN (0 / 0), as at::cross_entropy_loss.
  check<__nv_bfloat16>(3, 1000, 1000, LogitType::kBFloat16,
                       {{0, kIgnoreIndex}, {1, kIgnoreIndex}, {2, kIgnoreIndex}});
}
