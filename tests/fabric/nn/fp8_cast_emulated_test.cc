// fabric/nn/kernels/fp8_cast.cu run on the CPU through tools/cuda_emu (CUDA threads as host
// threads): the amax and cast kernels, tensorwise and per line, against a scalar reference of
// their contract (fp8_cast.h) with the CUDA headers' own float8 rounding, for float32, bf16 and
// fp16 inputs whose rows and columns are not multiples of the 64 × 64 tile, e4m3 and e5m2, with
// the preconditions refused; the casts of an activation's values (GELU, SwiGLU and their
// gradients, from their operands); delayed scaling's cast (the scale from a history with non-finite
// entries skipped, the tensor's amax recorded), the history's push and the byte transpose. What
// it checks is the kernels' indexing, tiling, shared-memory transpose and reductions; the device's
// arithmetic is fp8_cuda_test's and fp8_nodes_cuda_test's (on a GPU). The kernels come from
// tools/bazel/cuda.bzl's cuda_emulated_library.
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
#include <string>
#include <vector>

#include "fabric/nn/kernels/activations.cuh"
#include "fabric/nn/kernels/fp8_cast.h"

namespace {

using fabric::kernels::Fp8Op;
using fabric::kernels::Fp8Source;

template <typename T>
T from_float(float f);
template <>
float from_float<float>(float f) {
  return f;
}
template <>
__nv_bfloat16 from_float<__nv_bfloat16>(float f) {
  return __float2bfloat16(f);
}
template <>
__half from_float<__half>(float f) {
  return __float2half(f);
}
float to_float(float v) { return v; }
float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
float to_float(__half v) { return __half2float(v); }

float scale_for(float amax, float largest) { return largest / std::max(amax, 1e-12f); }

uint8_t reference(float v, float scale, bool e5m2) {
  return __nv_cvt_float_to_fp8(v * scale, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

// A 16-byte-aligned buffer of rows × cols values of T (normal, a few 10x outliers).
template <typename T>
struct Input {
  std::vector<T> storage;
  T* x;
  std::vector<float> values;
  Input(int64_t rows, int64_t cols, unsigned seed = 0)
      : storage(rows * cols + 16), values(rows * cols) {
    const auto misalignment = reinterpret_cast<uintptr_t>(storage.data()) % 16;
    x = reinterpret_cast<T*>(reinterpret_cast<char*>(storage.data()) + (16 - misalignment) % 16);
    std::mt19937 gen(static_cast<unsigned>(rows * 7919 + cols) + seed);
    std::normal_distribution<float> normal;
    for (int64_t i = 0; i < rows * cols; ++i) {
      x[i] = from_float<T>(normal(gen) * (i % 97 == 0 ? 30.f : 3.f));
      values[i] = to_float(x[i]);
    }
  }
};

// fp8_cast's col_sums in the kernel's order: per tile of 64 rows, each of the 32 thread rows s
// adds its rows s and s + 32 (from 0), then the thread rows are added in order (from 0).
std::vector<float> tile_sums(const std::vector<float>& values, int64_t rows, int64_t cols) {
  const int64_t tiles = (rows + 63) / 64;
  std::vector<float> out(tiles * cols);
  for (int64_t t = 0; t < tiles; ++t)
    for (int64_t c = 0; c < cols; ++c) {
      float total = 0.f;
      for (int64_t s = 0; s < 32; ++s) {
        float part = 0.f;
        for (int64_t p = 0; p < 2; ++p) {
          const int64_t r = 64 * t + s + 32 * p;
          if (r < rows) part += values[r * cols + c];
        }
        total += part;
      }
      out[t * cols + c] = total;
    }
  return out;
}

template <typename T>
void check_shape(int64_t rows, int64_t cols, Fp8Source type, bool e5m2) {
  const Input<T> in(rows, cols);
  const float largest = e5m2 ? 57344.f : 448.f;
  const int64_t n = rows * cols;
  // Tensorwise.
  float amax = -1.f, inverse = 0.f;
  ASSERT_TRUE(fabric::kernels::fp8_amax(in.x, n, type, &amax, nullptr) == 0) << "fp8_amax";
  float want = 0.f;
  for (float v : in.values) want = std::max(want, std::fabs(v));
  ASSERT_TRUE(amax == want) << "amax " << amax << ", want " << want << " (" << rows << " x " << cols
                            << ")";
  std::vector<uint8_t> q(n, 0xAB), qt(n, 0xAB);
  ASSERT_TRUE(fabric::kernels::fp8_cast(in.x, rows, cols, type, e5m2, &amax, q.data(), qt.data(),
                                        &inverse, nullptr) == 0)
      << "fp8_cast";
  const float scale = scale_for(want, largest);
  ASSERT_TRUE(inverse == 1.f / scale) << "inverse " << inverse << ", want " << 1.f / scale;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t e = reference(in.values[r * cols + c], scale, e5m2);
      ASSERT_TRUE(q[r * cols + c] == e)
          << "q[" << r << ", " << c << "] = " << static_cast<int>(q[r * cols + c]) << ", want "
          << static_cast<int>(e) << " (" << rows << " x " << cols << ")";
      ASSERT_TRUE(qt[c * rows + r] == e)
          << "qt[" << c << ", " << r << "] = " << static_cast<int>(qt[c * rows + r]) << ", want "
          << static_cast<int>(e) << " (" << rows << " x " << cols << ")";
    }
  // Only the transpose asked for: the same bytes.
  std::vector<uint8_t> qt_only(n, 0xAB);
  ASSERT_TRUE(fabric::kernels::fp8_cast(in.x, rows, cols, type, e5m2, &amax, nullptr,
                                        qt_only.data(), nullptr, nullptr) == 0)
      << "fp8_cast, qt only";
  ASSERT_TRUE(qt_only == qt) << "qt alone differs (" << rows << " x " << cols << ")";
  // With the column sums (a bias gradient): the same bytes, and the sums in the kernel's order.
  std::vector<float> sums(((rows + 63) / 64) * cols, -1.f);  // kFp8SumRows = 64
  std::fill(q.begin(), q.end(), 0xAB);
  ASSERT_TRUE(fabric::kernels::fp8_cast(in.x, rows, cols, type, e5m2, &amax, q.data(),
                                        qt_only.data(), nullptr, nullptr, sums.data()) == 0)
      << "fp8_cast with column sums";
  ASSERT_TRUE(qt_only == qt) << "qt with column sums differs (" << rows << " x " << cols << ")";
  ASSERT_TRUE(sums == tile_sums(in.values, rows, cols))
      << "column sums (" << rows << " x " << cols << ")";
  double most = 0;  // against the plain column sums, in double: float32 rounding only
  for (int64_t c = 0; c < cols; ++c) {
    double got = 0, want = 0, size = 0;
    for (int64_t t = 0; t < (rows + 63) / 64; ++t) got += sums[t * cols + c];
    for (int64_t r = 0; r < rows; ++r) {
      want += in.values[r * cols + c];
      size += std::fabs(in.values[r * cols + c]);
    }
    most = std::max(most, std::fabs(got - want) / std::max(size, 1e-30));
  }
  ASSERT_LT(most, 1e-6) << "column sums far from the rows' sum (" << rows << " x " << cols << ")";
  // Per line.
  std::vector<float> row_amax(rows, -1.f), col_amax(cols, -1.f), row_inverse(rows),
      col_inverse(cols), want_rows(rows, 0.f), want_cols(cols, 0.f);
  ASSERT_TRUE(fabric::kernels::fp8_amax_axes(in.x, rows, cols, type, row_amax.data(),
                                             col_amax.data(), nullptr) == 0)
      << "fp8_amax_axes";
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float a = std::fabs(in.values[r * cols + c]);
      want_rows[r] = std::max(want_rows[r], a);
      want_cols[c] = std::max(want_cols[c], a);
    }
  ASSERT_TRUE(row_amax == want_rows) << "row amax (" << rows << " x " << cols << ")";
  ASSERT_TRUE(col_amax == want_cols) << "column amax (" << rows << " x " << cols << ")";
  std::fill(q.begin(), q.end(), 0xAB);
  std::fill(qt.begin(), qt.end(), 0xAB);
  ASSERT_TRUE(fabric::kernels::fp8_cast_axes(in.x, rows, cols, type, e5m2, row_amax.data(),
                                             col_amax.data(), q.data(), qt.data(),
                                             row_inverse.data(), col_inverse.data(), nullptr) == 0)
      << "fp8_cast_axes";
  for (int64_t r = 0; r < rows; ++r)
    ASSERT_TRUE(row_inverse[r] == 1.f / scale_for(want_rows[r], largest)) << "row inverse " << r;
  for (int64_t c = 0; c < cols; ++c)
    ASSERT_TRUE(col_inverse[c] == 1.f / scale_for(want_cols[c], largest)) << "column inverse " << c;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = in.values[r * cols + c];
      ASSERT_TRUE(q[r * cols + c] == reference(v, scale_for(want_rows[r], largest), e5m2))
          << "rowwise q[" << r << ", " << c << "] (" << rows << " x " << cols << ")";
      ASSERT_TRUE(qt[c * rows + r] == reference(v, scale_for(want_cols[c], largest), e5m2))
          << "rowwise qt[" << c << ", " << r << "] (" << rows << " x " << cols << ")";
    }
}

template <typename T>
void check_delayed(int64_t rows, int64_t cols, Fp8Source type, bool e5m2) {
  const Input<T> in(rows, cols);
  const float largest = e5m2 ? 57344.f : 448.f;
  const int64_t n = rows * cols;
  float own = 0.f;
  for (float v : in.values) own = std::max(own, std::fabs(v));
  // Four entries and the record slot: the NaN and the infinity count as 0, so the scale is 2x
  // the tensor's own amax's (the cast uses half the range).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> history = {own * 0.5f, nan, own * 2.f, inf, 0.f};
  std::vector<uint8_t> q(n, 0xAB), qt(n, 0xAB);
  float inverse = 0.f;
  std::vector<float> sums(((rows + 63) / 64) * cols, -1.f);
  ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(in.x, rows, cols, type, e5m2, history.data(), 4,
                                                &history[4], q.data(), qt.data(), &inverse, nullptr,
                                                sums.data()) == 0)
      << "fp8_cast_delayed";
  ASSERT_TRUE(sums == tile_sums(in.values, rows, cols)) << "delayed column sums";
  const float scale = scale_for(own * 2.f, largest);
  ASSERT_TRUE(inverse == 1.f / scale) << "inverse " << inverse << ", want " << 1.f / scale;
  ASSERT_TRUE(history[4] == own) << "recorded " << history[4] << ", want " << own;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t e = reference(in.values[r * cols + c], scale, e5m2);
      ASSERT_TRUE(q[r * cols + c] == e && qt[c * rows + r] == e)
          << "delayed q/qt at " << r << ", " << c << " (" << rows << " x " << cols << ")";
    }
  // The push: the record first, the rest one place older (the infinity dropped), the slot 0.
  ASSERT_TRUE(fabric::kernels::fp8_history_push(history.data(), 4, nullptr) == 0);
  const std::vector<float> want = {own, own * 0.5f, nan, own * 2.f, 0.f};
  ASSERT_TRUE(std::memcmp(history.data(), want.data(), sizeof(float) * 5) == 0)
      << "pushed history " << history[0] << " " << history[1] << " " << history[2] << " "
      << history[3] << " " << history[4];
  // Without a record: the history is only read.
  std::fill(q.begin(), q.end(), 0xAB);
  ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(in.x, rows, cols, type, e5m2, history.data(), 1,
                                                nullptr, q.data(), nullptr, &inverse,
                                                nullptr) == 0);
  ASSERT_TRUE(inverse == 1.f / scale_for(own, largest));
  ASSERT_TRUE(std::memcmp(history.data(), want.data(), sizeof(float) * 5) == 0);
  ASSERT_TRUE(q[0] == reference(in.values[0], scale_for(own, largest), e5m2));
  ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(in.x, rows, cols, type, e5m2, history.data(), 0,
                                                nullptr, q.data(), nullptr, &inverse, nullptr) != 0)
      << "an empty history was accepted";
  // A margin of m: the scale of largest · 2^-m against the same history, the same bits as ATen's
  // (fp8_quantize.cc scales the numerator so too).
  for (const int margin : {1, 3}) {
    std::fill(q.begin(), q.end(), 0xAB);
    std::fill(qt.begin(), qt.end(), 0xAB);
    ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(in.x, rows, cols, type, e5m2, history.data(), 1,
                                                  nullptr, q.data(), qt.data(), &inverse, nullptr,
                                                  nullptr, {}, margin) == 0)
        << "margin " << margin;
    const float s_m = scale_for(own, std::ldexp(largest, -margin));
    ASSERT_TRUE(inverse == 1.f / s_m) << "margin " << margin << ": inverse " << inverse;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = i / cols, c = i % cols;
      const uint8_t e = reference(in.values[i], s_m, e5m2);
      ASSERT_TRUE(q[i] == e && qt[c * rows + r] == e)
          << "margin " << margin << ": q/qt at " << r << ", " << c;
    }
  }
  ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(in.x, rows, cols, type, e5m2, history.data(), 1,
                                                nullptr, q.data(), nullptr, &inverse, nullptr,
                                                nullptr, {}, -1) != 0)
      << "a negative margin was accepted";
}

// An op's value (fp8_cast.h's Fp8Op) at x with operands a and b: activations.cuh's functions (the
// device's arithmetic is fp8_cuda_test's and fp8_nodes_cuda_test's), rounded to T where the
// unfused kernels round.
template <typename T>
float round_to(float v) {
  return to_float(from_float<T>(v));
}
template <typename T>
float op_as(Fp8Op op, float x, float a, float b) {
  switch (op) {
    case Fp8Op::kGeluTanh:
      return round_to<T>(fabric::kernels::gelu_tanh(x));
    case Fp8Op::kGeluTanhGrad:
      return round_to<T>(fabric::kernels::gelu_tanh_grad(x, a));
    case Fp8Op::kSwiglu:
      return round_to<T>(round_to<T>(fabric::kernels::silu(x)) * a);
    case Fp8Op::kSwigluGateGrad:
      return round_to<T>(fabric::kernels::silu_grad(round_to<T>(x * b), a));
    case Fp8Op::kSwigluUpGrad:
      return round_to<T>(x * round_to<T>(fabric::kernels::silu(a)));
    case Fp8Op::kNone:
      break;
  }
  return x;
}

// op: amax, cast (dynamic and delayed; e5m2 for the gradients, as fp8_gemm.cc casts them), record
// and column sums of its values from x and its operands; an operand read at the wrong place
// (another row, column or tile) changes them, a missing or misaligned one is refused.
template <typename T>
void check_op(Fp8Op op, int64_t rows, int64_t cols, Fp8Source type) {
  const Input<T> x(rows, cols), a(rows, cols, 17), b(rows, cols, 29);
  const int64_t n = rows * cols;
  const bool e5m2 =
      op == Fp8Op::kGeluTanhGrad || op == Fp8Op::kSwigluGateGrad || op == Fp8Op::kSwigluUpGrad;
  const float largest = e5m2 ? 57344.f : 448.f;
  const bool two = op == Fp8Op::kSwigluGateGrad, one = two || (op != Fp8Op::kGeluTanh);
  const fabric::kernels::Fp8Pointwise f{op, one ? a.x : nullptr, two ? b.x : nullptr};
  std::vector<float> v(n);
  float own = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    v[i] = op_as<T>(op, x.values[i], a.values[i], b.values[i]);
    own = std::max(own, std::fabs(v[i]));
  }
  const std::string at = " (op " + std::to_string(static_cast<int>(op)) + ", " +
                         std::to_string(rows) + " x " + std::to_string(cols) + ")";
  float amax = -1.f, inverse = 0.f;
  ASSERT_TRUE(fabric::kernels::fp8_amax(x.x, n, type, &amax, nullptr, f) == 0) << at;
  ASSERT_TRUE(amax == own) << "amax " << amax << ", want " << own << at;
  std::vector<uint8_t> q(n, 0xAB), qt(n, 0xAB);
  std::vector<float> sums(((rows + 63) / 64) * cols, -1.f);
  ASSERT_TRUE(fabric::kernels::fp8_cast(x.x, rows, cols, type, e5m2, &amax, q.data(), qt.data(),
                                        &inverse, nullptr, sums.data(), f) == 0)
      << at;
  const float scale = scale_for(own, largest);
  ASSERT_TRUE(inverse == 1.f / scale) << at;
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t e = reference(v[i], scale, e5m2);
    ASSERT_TRUE(q[i] == e && qt[(i % cols) * rows + i / cols] == e) << "q/qt at " << i << at;
  }
  ASSERT_TRUE(sums == tile_sums(v, rows, cols)) << "column sums" << at;
  std::vector<float> history = {own * 2.f, 0.f};
  std::vector<uint8_t> qd(n, 0xAB), qtd(n, 0xAB);
  ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(x.x, rows, cols, type, e5m2, history.data(), 1,
                                                &history[1], qd.data(), qtd.data(), &inverse,
                                                nullptr, nullptr, f) == 0)
      << at;
  ASSERT_TRUE(history[1] == own) << "record " << history[1] << ", want " << own << at;
  const float delayed = scale_for(own * 2.f, largest);
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t e = reference(v[i], delayed, e5m2);
    ASSERT_TRUE(qd[i] == e && qtd[(i % cols) * rows + i / cols] == e) << "delayed at " << i << at;
  }
  if (two) {  // SwiGLU's gradients: both amaxes from one pass
    float up_own = 0.f;
    for (int64_t i = 0; i < n; ++i)
      up_own = std::max(up_own,
                        std::fabs(op_as<T>(Fp8Op::kSwigluUpGrad, x.values[i], a.values[i], 0.f)));
    float both[2] = {-1.f, -1.f};
    ASSERT_TRUE(fabric::kernels::fp8_amax_swiglu_grads(x.x, a.x, b.x, n, type, both, nullptr) == 0)
        << at;
    EXPECT_TRUE(both[0] == own && both[1] == up_own)
        << "swiglu gradients' amaxes " << both[0] << ", " << both[1] << "; want " << own << ", "
        << up_own << at;
    EXPECT_TRUE(fabric::kernels::fp8_amax_swiglu_grads(
                    x.x, a.x, reinterpret_cast<const char*>(b.x) + 4, n, type, both, nullptr) != 0)
        << at;
  }
  if (!one) return;
  // An operand missing or 4 bytes past a 16-byte boundary (b too where the op reads it).
  using P = fabric::kernels::Fp8Pointwise;
  const auto* off_a = reinterpret_cast<const char*>(a.x) + 4;
  const auto* off_b = reinterpret_cast<const char*>(b.x) + 4;
  std::vector<P> bads = {P{op, nullptr, f.b}, P{op, off_a, f.b}};
  if (two) bads.insert(bads.end(), {P{op, f.a, nullptr}, P{op, f.a, off_b}});
  for (const P& bad : bads) {
    EXPECT_TRUE(fabric::kernels::fp8_amax(x.x, n, type, &amax, nullptr, bad) != 0) << at;
    EXPECT_TRUE(fabric::kernels::fp8_cast(x.x, rows, cols, type, e5m2, &amax, q.data(), nullptr,
                                          &inverse, nullptr, nullptr, bad) != 0)
        << at;
  }
}

void check_preconditions() {
  Input<float> in(16, 16);
  float amax = 0.f;
  std::vector<uint8_t> q(256);
  // 12 bytes past a 16-byte boundary; 10 columns (not a multiple of 8).
  ASSERT_TRUE(fabric::kernels::fp8_amax(in.x + 3, 8, Fp8Source::kFloat32, &amax, nullptr) != 0)
      << "a misaligned input was accepted";
  ASSERT_TRUE(fabric::kernels::fp8_cast(in.x + 3, 8, 8, Fp8Source::kFloat32, false, &amax, q.data(),
                                        nullptr, nullptr, nullptr) != 0)
      << "a misaligned input was accepted";
  ASSERT_TRUE(fabric::kernels::fp8_cast(in.x, 12, 10, Fp8Source::kFloat32, false, &amax, q.data(),
                                        nullptr, nullptr, nullptr) != 0)
      << "10 columns were accepted";
}

}  // namespace

TEST(Fp8CastEmulatedTest, KernelsWriteTheReferencesBytesForEveryShapeAndType) {
  // The emulated device holds 4 blocks (tools/cuda_emu/shim.h), so a block casts several row
  // tiles in turn: 200 x 72 with a stride of 2, 328 x 24 and 520 x 8 of 3 (short last tiles);
  // 112 x 160's 3 columns of tiles fill half the device: a block per tile.
  const int64_t shapes[][2] = {{112, 160}, {64, 64}, {8, 8},    {200, 72},
                               {8, 520},   {136, 8}, {328, 24}, {520, 8}};
  for (const auto& s : shapes)
    for (const bool e5m2 : {false, true}) {
      check_shape<float>(s[0], s[1], Fp8Source::kFloat32, e5m2);
      check_shape<__nv_bfloat16>(s[0], s[1], Fp8Source::kBFloat16, e5m2);
      check_shape<__half>(s[0], s[1], Fp8Source::kFloat16, e5m2);
    }
}

TEST(Fp8CastEmulatedTest, MisalignedInputsAndOddColumnsAreRefused) { check_preconditions(); }

TEST(Fp8CastEmulatedTest, PointwiseOpsAreQuantizedAsTheirValues) {
  // 200 x 72 and 328 x 24: blocks cast several row tiles (their next tile's operands in flight
  // with x's); 112 x 160: a block per tile.
  const int64_t shapes[][2] = {{112, 160}, {8, 8}, {200, 72}, {328, 24}};
  for (const Fp8Op op : {Fp8Op::kGeluTanh, Fp8Op::kGeluTanhGrad, Fp8Op::kSwiglu,
                         Fp8Op::kSwigluGateGrad, Fp8Op::kSwigluUpGrad})
    for (const auto& s : shapes) {
      check_op<float>(op, s[0], s[1], Fp8Source::kFloat32);
      check_op<__nv_bfloat16>(op, s[0], s[1], Fp8Source::kBFloat16);
      check_op<__half>(op, s[0], s[1], Fp8Source::kFloat16);
    }
}

// A history longer than the block (Transformer Engine's default length, 1024): the block's 256
// threads read every 256th entry each and share the maximum; the largest finite entry sits where
// only a thread's fourth read finds it, a larger NaN and infinity count as 0.
TEST(Fp8CastEmulatedTest, DelayedCastTakesTheLargestOfALongHistory) {
  const Input<float> in(16, 64);
  std::vector<float> history(1025, 0.f);
  for (size_t i = 0; i < 1024; ++i) history[i] = 0.25f + 0.001f * static_cast<float>(i % 97);
  history[1000] = 3.5f;
  history[700] = std::numeric_limits<float>::quiet_NaN();
  history[5] = std::numeric_limits<float>::infinity();
  std::vector<uint8_t> q(16 * 64);
  float inverse = 0.f;
  ASSERT_TRUE(fabric::kernels::fp8_cast_delayed(in.x, 16, 64, Fp8Source::kFloat32, false,
                                                history.data(), 1024, nullptr, q.data(), nullptr,
                                                &inverse, nullptr) == 0);
  EXPECT_EQ(inverse, 1.f / scale_for(3.5f, 448.f));
  EXPECT_EQ(q[3], reference(in.values[3], scale_for(3.5f, 448.f), false));
}

TEST(Fp8CastEmulatedTest, DelayedCastScalesByTheHistoryAndRecordsTheTensorsAmax) {
  const int64_t shapes[][2] = {{112, 160}, {8, 8}, {200, 72}, {520, 8}};
  for (const auto& s : shapes)
    for (const bool e5m2 : {false, true}) {
      check_delayed<float>(s[0], s[1], Fp8Source::kFloat32, e5m2);
      check_delayed<__nv_bfloat16>(s[0], s[1], Fp8Source::kBFloat16, e5m2);
      check_delayed<__half>(s[0], s[1], Fp8Source::kFloat16, e5m2);
    }
}

// fp8_transpose: qt[c, r] == q[r, c] for every byte, over shapes whose rows and columns are not
// multiples of the 64 x 64 tile (and one larger than the emulated wave); sizes that are not
// multiples of 8, and a misaligned q, refused with nothing written.
TEST(Fp8CastEmulatedTest, TransposeWritesEveryByteTransposed) {
  const int64_t shapes[][2] = {{112, 160}, {8, 8}, {200, 72}, {520, 8}, {64, 1024}};
  std::mt19937 gen(7);
  for (const auto& s : shapes) {
    const int64_t rows = s[0], cols = s[1];
    std::vector<uint8_t> q(rows * cols + 16), qt(rows * cols, 0);
    for (auto& b : q) b = static_cast<uint8_t>(gen());
    ASSERT_EQ(fabric::kernels::fp8_transpose(q.data(), rows, cols, qt.data(), nullptr), 0);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(qt[c * rows + r], q[r * cols + c])
            << "qt[" << c << ", " << r << "] of " << rows << " x " << cols;
  }
  std::vector<uint8_t> q(16 * 24 + 16, 1), qt(16 * 24, 0);
  EXPECT_NE(fabric::kernels::fp8_transpose(q.data(), 12, 24, qt.data(), nullptr), 0);
  EXPECT_NE(fabric::kernels::fp8_transpose(q.data(), 16, 20, qt.data(), nullptr), 0);
  EXPECT_NE(fabric::kernels::fp8_transpose(q.data() + 1, 16, 24, qt.data(), nullptr), 0);
  EXPECT_TRUE(std::all_of(qt.begin(), qt.end(), [](uint8_t b) { return b == 0; }));
}
