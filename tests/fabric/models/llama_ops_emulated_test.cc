// fabric/models/kernels/llama_ops.cu run on the CPU through tools/cuda_emu (CUDA threads as host
// threads): the rotary embedding (forward and backward, strided rows as the queries' transposed
// view has them, and contiguous ones) and SwiGLU (forward and backward, a length that is not a
// multiple of the kernels' 4-value vectors), bf16 and fp16 (float32 angles), against the ATen
// operators' float32 arithmetic and roundings written out here element by element: equal
// bitwise. It checks the kernels' indexing and where
// they round; the device's arithmetic is gpt_cuda_test's (on a GPU).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fabric/models/kernels/convert.cuh"
#include "fabric/models/kernels/llama_ops.h"

namespace {

using fabric::kernels::from_float;
using fabric::kernels::LogitType;
using fabric::kernels::RotaryStrides;
using fabric::kernels::to_float;

template <typename T>
float r16(float v) {
  return to_float(from_float<T>(v));
}

template <typename T>
std::vector<T> random16(size_t n, std::mt19937& gen, float scale = 1.f) {
  std::normal_distribution<float> normal;
  std::vector<T> v(n);
  for (auto& x : v) x = from_float<T>(normal(gen) * scale);
  return v;
}

// [B, H, T, D] stored as [B, T, H, D] (`transposed`, the queries' view) or contiguous.
RotaryStrides layout(int64_t H, int64_t T, int64_t D, bool transposed) {
  return transposed ? RotaryStrides{T * H * D, D, H * D} : RotaryStrides{H * T * D, T * D, D};
}

template <typename T>
void check_rotary(bool backward, bool transposed, LogitType type) {
  const int64_t nb = 2, nh = 3, nt = 5, nd = 24;
  std::mt19937 gen(static_cast<unsigned>(backward * 2 + transposed));
  const size_t n = nb * nh * nt * nd;
  const auto x = random16<T>(n, gen, 2.f);
  std::normal_distribution<float> normal;
  std::vector<float> cos(nt * nd), sin(nt * nd);
  for (auto& v : cos) v = normal(gen);
  for (auto& v : sin) v = normal(gen);
  const RotaryStrides s = layout(nh, nt, nd, transposed);
  std::vector<T> y(n, from_float<T>(-999.f));
  ASSERT_EQ(fabric::kernels::rotary(x.data(), s, y.data(), s, cos.data(), sin.data(), nb, nh, nt,
                                    nd, backward, type, nullptr),
            0);
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < nt; ++t) {
        const int64_t row = b * s.b + h * s.h + t * s.t;
        for (int64_t j = 0; j < nd; ++j) {
          const int64_t p = j < nd / 2 ? j + nd / 2 : j - nd / 2;  // the partner
          const float v = to_float(x[row + j]), w = to_float(x[row + p]);
          float want;
          if (!backward) {  // float32: rotate_half(x)[j] = -x[j + nd/2] (first half), x[j - nd/2]
            const float rot = j < nd / 2 ? -w : w;
            const float a = v * cos[t * nd + j], b = rot * sin[t * nd + j];
            want = r16<T>(a + b);
          } else {  // each rounded: + (x·sin)[j + nd/2] (first half), - (x·sin)[j - nd/2]
            const float a = r16<T>(v * cos[t * nd + j]);
            const float u = r16<T>(w * sin[t * nd + p]);
            want = r16<T>(j < nd / 2 ? a + u : a - u);
          }
          ASSERT_EQ(to_float(y[row + j]), want)
              << (backward ? "backward" : "forward") << " (" << b << ", " << h << ", " << t << ", "
              << j << ")" << (transposed ? " transposed" : "");
        }
      }
}

float silu(float x) { return x / (1.f + std::exp(-x)); }

template <typename T>
void check_swiglu(LogitType type) {
  const int64_t n = 1003;  // 250 vectors of 4 and a tail of 3
  std::mt19937 gen(7);
  const auto g = random16<T>(n, gen, 3.f), u = random16<T>(n, gen), dy = random16<T>(n, gen);
  std::vector<T> y(n), dg(n), du(n);
  ASSERT_EQ(fabric::kernels::swiglu_forward(g.data(), u.data(), y.data(), n, type, nullptr), 0);
  ASSERT_EQ(fabric::kernels::swiglu_backward(dy.data(), g.data(), u.data(), dg.data(), du.data(), n,
                                             type, nullptr),
            0);
  for (int64_t i = 0; i < n; ++i) {
    const float x = to_float(g[i]), up = to_float(u[i]), d = to_float(dy[i]);
    const float s = r16<T>(silu(x));  // torch::silu's output
    ASSERT_EQ(to_float(y[i]), r16<T>(s * up)) << "y[" << i << "]";
    ASSERT_EQ(to_float(du[i]), r16<T>(d * s)) << "dup[" << i << "]";
    const float ds = r16<T>(d * up), sig = 1.f / (1.f + std::exp(-x));
    ASSERT_EQ(to_float(dg[i]), r16<T>(ds * sig * (1.f + x * (1.f - sig)))) << "dgate[" << i << "]";
  }
}

}  // namespace

TEST(LlamaOpsEmulatedTest, RotaryEqualsTheATenChainBitwise) {
  for (const bool backward : {false, true})
    for (const bool transposed : {false, true}) {
      check_rotary<__nv_bfloat16>(backward, transposed, LogitType::kBFloat16);
      check_rotary<__half>(backward, transposed, LogitType::kFloat16);
    }
}

TEST(LlamaOpsEmulatedTest, RotaryRefusesAWidthNotAMultipleOf8) {
  std::vector<__nv_bfloat16> x(12), y(12);
  std::vector<float> c(12), s(12);
  const RotaryStrides st{12, 12, 12};
  EXPECT_NE(fabric::kernels::rotary(x.data(), st, y.data(), st, c.data(), s.data(), 1, 1, 1, 12,
                                    false, LogitType::kBFloat16, nullptr),
            0);
}

TEST(LlamaOpsEmulatedTest, SwigluEqualsSiluTimesUpBitwise) {
  check_swiglu<__nv_bfloat16>(LogitType::kBFloat16);
  check_swiglu<__half>(LogitType::kFloat16);
}
