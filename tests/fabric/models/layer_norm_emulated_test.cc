// fabric/models/kernels/layer_norm.cu run on the CPU through tools/cuda_emu (CUDA threads as host
// threads): the fused LayerNorm's and RMSNorm's forward (with and without the residual add) and
// backward (with and without an incoming gradient and a 16-bit copy of it) against a
// double-precision reference,
// bf16 and fp16, for row counts that leave a block's warps idle and that make the backward's
// warps loop over rows. It checks the kernels' indexing, warp reductions and the backward's
// per-block sums; the device's arithmetic is gpt_cuda_test's (on a GPU). The float8 output
// (fp8-mixed under delayed scaling) against the 16-bit output cast as fp8_cast_delayed casts it.
// The kernels come from tools/bazel/cuda.bzl's cuda_emulated_library.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

#include "fabric/models/kernels/convert.cuh"
#include "fabric/models/kernels/layer_norm.h"

namespace {

using fabric::kernels::from_float;
using fabric::kernels::LogitType;
using fabric::kernels::to_float;

// |a - b| within `rel` of the largest |b| (plus a floor for values near 0).
bool near(double a, double b, double rel, double scale) {
  return std::fabs(a - b) <= rel * scale + 1e-6;
}

// rms: RMSNorm (no mean, no bias; mean stays as filled, the kernels must not write it).
template <typename T>
void check(int64_t rows, int64_t cols, bool with_delta, bool with_dh_in, bool with_dh16,
           LogitType type, bool rms = false) {
  const double step = std::is_same_v<T, __half> ? 1.0 / 1024 : 1.0 / 128;  // 16-bit spacing
  std::mt19937 gen(static_cast<unsigned>(rows * 31 + cols));
  std::normal_distribution<float> normal;
  const int64_t n = rows * cols;
  std::vector<float> x(n), h(n, -7.f), w(cols), b(cols), mean(rows), rstd(rows), dh_in(n), dh(n),
      dw(cols), db(cols);
  std::vector<T> delta(n), y(n), dy(n), dh16(n);
  for (auto& v : x) v = normal(gen) * 2 + 0.5f;
  for (auto& v : delta) v = from_float<T>(normal(gen));
  for (int64_t j = 0; j < cols; ++j) w[j] = 1 + 0.1f * normal(gen), b[j] = 0.1f * normal(gen);
  for (auto& v : dy) v = from_float<T>(normal(gen));
  for (auto& v : dh_in) v = normal(gen);
  const float eps = 1e-5f;
  if (rms) {
    std::fill(mean.begin(), mean.end(), 0.f);
    std::fill(b.begin(), b.end(), 0.f);
    ASSERT_TRUE(fabric::kernels::rms_norm_forward(x.data(), with_delta ? delta.data() : nullptr,
                                                  h.data(), w.data(), y.data(), rstd.data(), rows,
                                                  cols, eps, type, nullptr) == 0)
        << "forward launch";
  } else {
    ASSERT_TRUE(fabric::kernels::layer_norm_forward(
                    x.data(), with_delta ? delta.data() : nullptr, h.data(), w.data(), b.data(),
                    y.data(), mean.data(), rstd.data(), rows, cols, eps, type, nullptr) == 0)
        << "forward launch";
  }
  std::vector<double> hr(n), ref_mean(rows), ref_rstd(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double s = 0, q = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      hr[i] = with_delta ? static_cast<double>(x[i] + to_float(delta[i])) : x[i];
      s += hr[i];
    }
    ref_mean[r] = rms ? 0.0 : s / cols;
    for (int64_t j = 0; j < cols; ++j)
      q += (hr[r * cols + j] - ref_mean[r]) * (hr[r * cols + j] - ref_mean[r]);
    ref_rstd[r] = 1 / std::sqrt(q / cols + eps);
    ASSERT_TRUE(near(mean[r], ref_mean[r], 1e-5, 1))
        << "mean[" << r << "] " << mean[r] << ", want " << ref_mean[r];
    ASSERT_TRUE(near(rstd[r], ref_rstd[r], 1e-4, ref_rstd[r]))
        << "rstd[" << r << "] " << rstd[r] << ", want " << ref_rstd[r];
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      if (with_delta) {
        ASSERT_TRUE(h[i] == static_cast<float>(hr[i])) << "h[" << i << "]";
      }
      const double want = (hr[i] - ref_mean[r]) * ref_rstd[r] * w[j] + b[j];
      ASSERT_TRUE(near(to_float(y[i]), want, step, std::fabs(want) + 1))
          << "y[" << r << ", " << j << "] " << to_float(y[i]) << ", want " << want;
    }
  }
  // Backward, from h (the normalized input: x when there was no delta).
  const std::vector<float>& hin = with_delta ? h : x;
  std::vector<float> workspace(fabric::kernels::layer_norm_workspace_floats(rows, cols));
  if (rms) {
    ASSERT_TRUE(fabric::kernels::rms_norm_backward(dy.data(), hin.data(), rstd.data(), w.data(),
                                                   with_dh_in ? dh_in.data() : nullptr, dh.data(),
                                                   with_dh16 ? dh16.data() : nullptr, dw.data(),
                                                   workspace.data(), rows, cols, type,
                                                   nullptr) == 0)
        << "backward launch";
  } else {
    ASSERT_TRUE(fabric::kernels::layer_norm_backward(
                    dy.data(), hin.data(), mean.data(), rstd.data(), w.data(),
                    with_dh_in ? dh_in.data() : nullptr, dh.data(),
                    with_dh16 ? dh16.data() : nullptr, dw.data(), db.data(), workspace.data(), rows,
                    cols, type, nullptr) == 0)
        << "backward launch";
  }
  std::vector<double> ref_dw(cols, 0), ref_db(cols, 0);
  double largest_dh = 0;
  std::vector<double> ref_dh(n);
  for (int64_t r = 0; r < rows; ++r) {
    double s1 = 0, s2 = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double xhat = (hin[i] - mean[r]) * static_cast<double>(rstd[r]);
      const double gx = to_float(dy[i]) * static_cast<double>(w[j]);
      s1 += gx;
      s2 += gx * xhat;
      ref_dw[j] += to_float(dy[i]) * xhat;
      ref_db[j] += to_float(dy[i]);
    }
    s1 = rms ? 0.0 : s1 / cols;
    s2 /= cols;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double xhat = (hin[i] - mean[r]) * static_cast<double>(rstd[r]);
      ref_dh[i] = rstd[r] * (to_float(dy[i]) * w[j] - s1 - xhat * s2) + (with_dh_in ? dh_in[i] : 0);
      largest_dh = std::max(largest_dh, std::fabs(ref_dh[i]));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(near(dh[i], ref_dh[i], 1e-4, largest_dh))
        << "dh[" << i << "] " << dh[i] << ", want " << ref_dh[i] << " (" << rows << " x " << cols
        << ")";
    if (with_dh16) {
      ASSERT_TRUE(to_float(dh16[i]) == to_float(from_float<T>(dh[i])))
          << "dh16[" << i << "] is not dh in 16 bits";
    }
  }
  double largest_dw = 0, largest_db = 0;
  for (int64_t j = 0; j < cols; ++j)
    largest_dw = std::max(largest_dw, std::fabs(ref_dw[j])),
    largest_db = std::max(largest_db, std::fabs(ref_db[j]));
  for (int64_t j = 0; j < cols; ++j) {
    ASSERT_TRUE(near(dw[j], ref_dw[j], 1e-4, largest_dw))
        << "dweight[" << j << "] " << dw[j] << ", want " << ref_dw[j] << " (" << rows << " rows)";
    if (!rms) {
      ASSERT_TRUE(near(db[j], ref_db[j], 1e-4, largest_db))
          << "dbias[" << j << "] " << db[j] << ", want " << ref_db[j] << " (" << rows << " rows)";
    }
  }
}

// The forward with a float8 output (LayerNormFp8Out) against the same forward with a 16-bit one:
// h, mean and rstd bitwise the same, q the 16-bit y scaled by 448 / (the history's largest finite
// entry) and cast to e4m3 saturated (the bytes of CUDA's own conversion), the record the largest
// |y|, the inverse 1 / scale; y itself untouched. And with a record but no q, y as the 16-bit
// forward writes it and its largest magnitude recorded.
template <typename T>
void check_fp8(int64_t rows, int64_t cols, bool with_delta, LogitType type, bool rms) {
  std::mt19937 gen(static_cast<unsigned>(rows * 17 + cols));
  std::normal_distribution<float> normal;
  const int64_t n = rows * cols;
  std::vector<float> x(n), w(cols), b(cols);
  std::vector<T> delta(n);
  for (auto& v : x) v = normal(gen) * 2 + 0.5f;
  for (auto& v : delta) v = from_float<T>(normal(gen));
  for (int64_t j = 0; j < cols; ++j) w[j] = 1 + 0.1f * normal(gen), b[j] = 0.1f * normal(gen);
  const float eps = 1e-5f;
  const void* d = with_delta ? delta.data() : nullptr;
  auto run = [&](std::vector<float>& h, std::vector<T>& y, std::vector<float>& mean,
                 std::vector<float>& rstd, const fabric::kernels::LayerNormFp8Out& f8) {
    return rms ? fabric::kernels::rms_norm_forward(x.data(), d, h.data(), w.data(), y.data(),
                                                   rstd.data(), rows, cols, eps, type, nullptr, f8)
               : fabric::kernels::layer_norm_forward(x.data(), d, h.data(), w.data(), b.data(),
                                                     y.data(), mean.data(), rstd.data(), rows, cols,
                                                     eps, type, nullptr, f8);
  };
  std::vector<float> h16(n, -7.f), mean16(rows, 0.f), rstd16(rows);
  std::vector<T> y16(n);
  ASSERT_EQ(run(h16, y16, mean16, rstd16, {}), 0) << "16-bit forward launch";
  float largest = 0.f;
  for (const T& v : y16) largest = std::max(largest, std::fabs(to_float(v)));
  // The scale comes from the largest finite entry: a NaN and an infinity are skipped.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> history = {largest * 0.75f, nan, largest * 0.5f, inf, 0.f};
  const float scale = 448.f / (largest * 0.75f);  // some values saturate
  std::vector<float> h8(n, -7.f), mean8(rows, 0.f), rstd8(rows);
  std::vector<T> untouched(n, from_float<T>(3.f));
  std::vector<uint8_t> q(n, 0xAB);
  float inverse = 0.f;
  fabric::kernels::LayerNormFp8Out f8;
  f8.q = q.data();
  f8.history = history.data();
  f8.history_len = 4;
  f8.record = &history[4];
  f8.inverse = &inverse;
  ASSERT_EQ(run(h8, untouched, mean8, rstd8, f8), 0) << "float8 forward launch";
  const char* what = rms ? "RMSNorm" : "LayerNorm";
  ASSERT_TRUE(std::memcmp(h8.data(), h16.data(), sizeof(float) * n) == 0) << what << ": h differs";
  ASSERT_TRUE(std::memcmp(rstd8.data(), rstd16.data(), sizeof(float) * rows) == 0) << what;
  ASSERT_TRUE(std::memcmp(mean8.data(), mean16.data(), sizeof(float) * rows) == 0) << what;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(to_float(untouched[i]) == 3.f) << what << ": y written at " << i;
    const uint8_t want = __nv_cvt_float_to_fp8(to_float(y16[i]) * scale, __NV_SATFINITE, __NV_E4M3);
    ASSERT_EQ(q[i], want) << what << " q[" << i / cols << ", " << i % cols << "] of y "
                          << to_float(y16[i]) << " (" << rows << " x " << cols << ")";
  }
  ASSERT_TRUE(history[4] == largest) << what << ": recorded " << history[4] << ", want " << largest;
  ASSERT_TRUE(inverse == 1.f / scale) << what << ": inverse " << inverse;
  // No record: the history is only read; an empty history is refused.
  history[4] = 0.f;
  f8.record = nullptr;
  ASSERT_EQ(run(h8, untouched, mean8, rstd8, f8), 0);
  ASSERT_TRUE(history[4] == 0.f) << what << ": recorded without a record";
  f8.history_len = 0;
  ASSERT_NE(run(h8, untouched, mean8, rstd8, f8), 0) << what << ": an empty history was accepted";
  // A 16-bit output with its amax (no q, a record: tensorwise scaling's producer): y, h, mean and
  // rstd bitwise the plain forward's, the record the largest |y|.
  float amax = 0.f;
  fabric::kernels::LayerNormFp8Out only_amax;
  only_amax.record = &amax;
  std::vector<float> ha(n, -7.f), meana(rows, 0.f), rstda(rows);
  std::vector<T> ya(n);
  ASSERT_EQ(run(ha, ya, meana, rstda, only_amax), 0) << what << ": amax forward launch";
  ASSERT_TRUE(std::memcmp(ya.data(), y16.data(), sizeof(T) * n) == 0) << what << ": y differs";
  ASSERT_TRUE(std::memcmp(ha.data(), h16.data(), sizeof(float) * n) == 0) << what << ": h differs";
  ASSERT_TRUE(std::memcmp(rstda.data(), rstd16.data(), sizeof(float) * rows) == 0) << what;
  ASSERT_TRUE(std::memcmp(meana.data(), mean16.data(), sizeof(float) * rows) == 0) << what;
  ASSERT_TRUE(amax == largest) << what << ": amax " << amax << ", want " << largest;
}

}  // namespace

// 37 rows: the last block has one busy warp of 4 (the idle ones still take part in the block's
// amax); 264 columns: 66 float4 per row, more than a warp's lanes.
TEST(LayerNormEmulatedTest, Fp8OutputIsTheSixteenBitOutputCastWithTheHistorysScale) {
  for (const bool rms : {false, true}) {
    check_fp8<__nv_bfloat16>(37, 64, true, LogitType::kBFloat16, rms);
    check_fp8<__half>(37, 264, false, LogitType::kFloat16, rms);
    check_fp8<__nv_bfloat16>(130, 32, false, LogitType::kBFloat16, rms);
  }
}

// 37 rows: the last forward block has one busy warp of 4; 2200 rows: more than 264 blocks x 8
// warps, so the backward's warps take several rows each. 264 columns: 66 float4 per row, more
// than a warp's 32 lanes.
TEST(LayerNormEmulatedTest, ForwardAndBackwardMatchDoublePrecision) {
  check<__nv_bfloat16>(37, 64, true, true, true, LogitType::kBFloat16);
  check<__half>(37, 264, false, false, false, LogitType::kFloat16);
  check<__nv_bfloat16>(2200, 32, true, false, true, LogitType::kBFloat16);
}

// RMSNorm (rms_norm_forward / rms_norm_backward): the same shapes; the mean must stay untouched
// (0, as filled) and y must be weight · (h · rstd) without a bias.
TEST(LayerNormEmulatedTest, RmsNormForwardAndBackwardMatchDoublePrecision) {
  check<__nv_bfloat16>(37, 64, true, true, true, LogitType::kBFloat16, true);
  check<__half>(37, 264, false, false, false, LogitType::kFloat16, true);
  check<__nv_bfloat16>(2200, 32, true, false, true, LogitType::kBFloat16, true);
}
