// fabric::nn float8 GEMMs (fabric.precision: fp8-mixed) on a CUDA device of compute capability
// >= 8.9 (tag gpu; skips elsewhere): the float8 linear equals the CPU's float8 GEMM and stays near
// float32; its quantization kernels (fabric/nn/kernels/fp8_cast.h) give ATen's bits, tensorwise
// and rowwise, and rowwise keeps an outlier row from coarsening the others; fast accumulation
// changes only the forward GEMM, by less than 1%; the cast kernels' two grids give the same bits.
// The CPU side is fp8_test and fp8_equivalence_test; several layers as one node:
// fp8_nodes_cuda_test.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/utils.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "fabric/nn/fp8.h"
#include "tests/cuda_skip.h"

namespace {

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max() /
          b.to(torch::kFloat).abs().max().clamp_min(1e-30))
      .item<double>();
}

double relative_norm(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).norm() / b.to(torch::kFloat).norm())
      .item<double>();
}

// On sm_89+ _scaled_mm is cuBLASLt's float8 GEMM. The scales are computed alike on both devices
// and a product of two float8 values is exact in float32, so the product and both gradients
// stay within 0.1% of the CPU's float8 GEMM (LibTorch's emulated _scaled_mm arithmetic,
// fp8_gemm.cc) of the same operands (with precise accumulation), and a few percent from
// float32's (they were quantized: not equal to it either).
TEST(Fp8CudaTest, Fp8LinearOnCudaEqualsTheCpusAndStaysNearFloat32) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  if (!fabric::nn::fp8_supported(torch::Device(torch::kCUDA, 0), &why)) GTEST_SKIP() << why;
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({4, 64, 256}), w0 = torch::randn({384, 256}) * 0.05,
                      b0 = torch::randn({384}), probe = torch::randn({4, 64, 384});
  auto run = [&](torch::Device d, bool fp8) {
    // (Copies: to() of a CPU tensor to the CPU is the tensor itself, whose gradient the next
    // CPU run would add to.)
    torch::Tensor x = x0.to(d, false, true).requires_grad_(),
                  w = w0.to(d, false, true).requires_grad_(),
                  b = b0.to(d, false, true).requires_grad_();
    torch::Tensor y = fp8 ? fabric::nn::fp8_linear(x, w, b, fabric::nn::Fp8Scaling::kTensorwise,
                                                   nullptr, false, /*fast_accumulation=*/false)
                          : torch::linear(x, w, b);
    (y * probe.to(d)).sum().backward();
    return std::vector<torch::Tensor>{y.detach().cpu(), x.grad().cpu(), w.grad().cpu(),
                                      b.grad().cpu()};
  };
  const auto cuda = run(torch::kCUDA, true), cpu = run(torch::kCPU, true),
             exact = run(torch::kCPU, false);
  for (size_t i = 0; i < cuda.size(); ++i) {
    EXPECT_EQ(cuda[i].scalar_type(), torch::kFloat) << i;
    // (Not bitwise: a value on a rounding tie may land on another float8 step on either side.)
    EXPECT_LT(relative_norm(cuda[i], cpu[i]), 1e-3)
        << i << ": largest difference " << max_rel(cuda[i], cpu[i]) << " of the largest element";
    EXPECT_LT(relative_norm(cuda[i], exact[i]), i == 0 ? 0.06 : 0.15) << i;
  }
  EXPECT_GT(relative_norm(cuda[0], exact[0]), 1e-4);
  EXPECT_GT(relative_norm(cuda[2], exact[2]), 1e-4);
}

// The CUDA path quantizes with its own kernels (fabric/nn/kernels/fp8_cast.h): they must give
// the bits ATen's ops give, so the product and both gradients equal _scaled_mm of operands
// quantized by ATen, bitwise; for float32, bf16 and fp16 inputs, rows and columns not multiples
// of the kernels' 64 × 64 tile, and an input that starts 6 or 12 bytes into its allocation (the
// kernels read 16 bytes at a time: fp8_quantize.cc copies such an input first).
// fabric.fp8.fast_accumulation (on by default), tensorwise: the forward GEMM accumulates in the
// tensor cores' fast mode and the two gradient GEMMs precisely (torchao's defaults): over a long
// reduction (K = 4096) the output stays within 1% of the precise GEMM's; the gradients are bitwise
// the same.
TEST(Fp8CudaTest, FastAccumulationChangesOnlyTheForwardGemm) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  if (!fabric::nn::fp8_supported(torch::Device(torch::kCUDA, 0), &why)) GTEST_SKIP() << why;
  torch::manual_seed(5);
  const torch::Device d(torch::kCUDA, 0);
  const torch::Tensor x0 = torch::randn({256, 4096}, d), w0 = torch::randn({512, 4096}, d) * 0.02,
                      probe = torch::randn({256, 512}, d);
  auto run = [&](bool fast) {
    torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    torch::Tensor y =
        fabric::nn::fp8_linear(x, w, {}, fabric::nn::Fp8Scaling::kTensorwise, nullptr, false, fast);
    (y * probe).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad()};
  };
  const auto fast = run(true), precise = run(false);
  EXPECT_LT(relative_norm(fast[0], precise[0]), 1e-2) << max_rel(fast[0], precise[0]);
  EXPECT_TRUE(torch::equal(fast[1], precise[1]));
  EXPECT_TRUE(torch::equal(fast[2], precise[2]));
}

TEST(Fp8CudaTest, Fp8LinearsKernelsQuantizeAsATenDoes) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  const torch::Device cuda(torch::kCUDA, 0);
  if (!fabric::nn::fp8_supported(cuda, &why)) GTEST_SKIP() << why;
  struct Q {
    torch::Tensor q, inverse;
  };
  auto quantize = [](const torch::Tensor& t, c10::ScalarType dtype, double largest) {
    const torch::Tensor scale = largest / t.abs().amax().to(torch::kFloat).clamp_min(1e-12);
    return Q{(t.to(torch::kFloat) * scale).clamp(-largest, largest).to(dtype), scale.reciprocal()};
  };
  // fast: the forward's GEMM accumulates fast (fabric.fp8.fast_accumulation's default), the
  // gradients' precisely.
  auto mm = [](const torch::Tensor& a, const torch::Tensor& b, const Q& qa, const Q& qb,
               c10::ScalarType out, bool fast = false) {
    return at::_scaled_mm(a, b, qa.inverse, qb.inverse, std::nullopt, std::nullopt, out, fast);
  };
  torch::manual_seed(1);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf})
    for (const bool misaligned : {false, true}) {
      const torch::Tensor x0 = (torch::randn({112, 160}) * 3).to(cuda, dtype),
                          w0 = (torch::randn({48, 160}) * 0.05).to(cuda),
                          g0 = torch::randn({112, 48}).to(cuda, dtype);
      torch::Tensor x = x0.clone();
      if (misaligned)  // 3 elements in: contiguous, 6 or 12 bytes past a 16-byte boundary
        x = torch::empty({112 * 160 + 3}, x0.options()).narrow(0, 3, 112 * 160).view({112, 160});
      x.copy_(x0);
      x = x.detach().requires_grad_();
      ASSERT_EQ(reinterpret_cast<uintptr_t>(x.data_ptr()) % 16 != 0, misaligned);
      torch::Tensor w = w0.clone().requires_grad_();
      const torch::Tensor y = fabric::nn::fp8_linear(x, w, torch::Tensor());
      y.backward(g0);
      const Q qx = quantize(x0, torch::kFloat8_e4m3fn, 448),
              qw = quantize(w0, torch::kFloat8_e4m3fn, 448),
              qg = quantize(g0, torch::kFloat8_e5m2, 57344);
      EXPECT_TRUE(torch::equal(y, mm(qx.q, qw.q.t(), qx, qw, dtype, true))) << dtype << misaligned;
      EXPECT_TRUE(torch::equal(x.grad(), mm(qg.q, qw.q.t().contiguous().t(), qg, qw, dtype)))
          << dtype;
      EXPECT_TRUE(torch::equal(
          w.grad(), mm(qg.q.t().contiguous(), qx.q.t().contiguous().t(), qg, qx, torch::kFloat)))
          << dtype;
    }
}

// Rowwise (fabric.fp8.recipe: rowwise, compute capability >= 9.0; gradients in e4m3 too): our
// kernels' scales per row and per column give ATen's bits (the product and both gradients equal
// _scaled_mm of operands ATen quantized line by line), and a row with an outlier costs the other
// rows nothing: their error against float32 is below a tenth of tensorwise's. (The outlier is
// 1e6 times the rest: e4m3 keeps relative precision down to 2^-6, so a 1e3 outlier, as this test
// had, still left the other rows normal numbers under one scale: 0.0366 vs 0.0383 on an H200.)
TEST(Fp8CudaTest, Fp8RowwiseQuantizesAsATenDoesAndIsolatesAnOutlierRow) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  const torch::Device cuda(torch::kCUDA, 0);
  if (!fabric::nn::fp8_supported(cuda, &why, fabric::nn::Fp8Scaling::kRowwise)) GTEST_SKIP() << why;
  struct Q {
    torch::Tensor q, inverse;
  };
  // Scales per line along `dim` (1: per row, 0: per column), as keepdim shapes.
  auto lines = [](const torch::Tensor& t, c10::ScalarType dtype, double largest, int64_t dim) {
    const torch::Tensor scale =
        largest / t.abs().amax(dim, true).to(torch::kFloat).clamp_min(1e-12);
    return Q{(t.to(torch::kFloat) * scale).clamp(-largest, largest).to(dtype), scale.reciprocal()};
  };
  // (Rowwise's three GEMMs accumulate fast by default, as torchao's.)
  auto mm = [](const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& sa,
               const torch::Tensor& sb) {
    return at::_scaled_mm(a, b, sa, sb, std::nullopt, std::nullopt, torch::kBFloat16, true);
  };
  torch::manual_seed(2);
  torch::Tensor x0 = torch::randn({112, 160});
  x0[5] *= 1e6;  // one outlier row: under one scale the others flush to zero in e4m3
  x0 = x0.to(cuda, torch::kBFloat16);
  const torch::Tensor w0 = (torch::randn({48, 160}) * 0.05).to(cuda),
                      g0 = torch::randn({112, 48}).to(cuda, torch::kBFloat16);
  torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  const torch::Tensor y =
      fabric::nn::fp8_linear(x, w, torch::Tensor(), fabric::nn::Fp8Scaling::kRowwise);
  y.backward(g0);
  const Q qx = lines(x0, torch::kFloat8_e4m3fn, 448, 1),
          qw = lines(w0, torch::kFloat8_e4m3fn, 448, 1),
          qg = lines(g0, torch::kFloat8_e4m3fn, 448, 1);
  const Q qw_cols = lines(w0, torch::kFloat8_e4m3fn, 448, 0),
          qg_cols = lines(g0, torch::kFloat8_e4m3fn, 448, 0),
          qx_cols = lines(x0, torch::kFloat8_e4m3fn, 448, 0);
  EXPECT_TRUE(torch::equal(y, mm(qx.q, qw.q.t(), qx.inverse, qw.inverse.view({1, -1}))));
  EXPECT_TRUE(torch::equal(x.grad(),
                           mm(qg.q, qw_cols.q.t().contiguous().t(), qg.inverse, qw_cols.inverse)));
  EXPECT_TRUE(torch::equal(w.grad(), mm(qg_cols.q.t().contiguous(), qx_cols.q.t().contiguous().t(),
                                        qg_cols.inverse.view({-1, 1}), qx_cols.inverse)
                                         .to(torch::kFloat)));
  const torch::Tensor exact = torch::linear(x0.to(torch::kFloat), w0);
  const torch::Tensor tensorwise = fabric::nn::fp8_linear(x0, w0, torch::Tensor());
  const torch::Tensor others = torch::cat({torch::arange(0, 5), torch::arange(6, 112)}).to(cuda);
  auto error = [&](const torch::Tensor& t) {
    return relative_norm(t.index_select(0, others), exact.index_select(0, others));
  };
  EXPECT_LT(error(y), 0.1 * error(tensorwise))
      << "rowwise " << error(y) << ", tensorwise " << error(tensorwise);
}

// Delayed scaling on CUDA (fabric.fp8.recipe: delayed; the kernels fp8_cast_delayed and
// fp8_history_push): the first training pass is tensorwise's bitwise (bias included: its gradient
// from the cast kernel's column sums, within float32 rounding of the rows' sum); a second pass on
// a smaller input scales by the first input's amax (the product near the dequantized reference,
// not tensorwise's) and the history holds each amax exactly, newest first.
TEST(Fp8CudaTest, DelayedScalesFromTheHistoryAndTheBiasGradientFromTheCast) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  const torch::Device cuda(torch::kCUDA, 0);
  if (!fabric::nn::fp8_supported(cuda, &why)) GTEST_SKIP() << why;
  using fabric::nn::Fp8Scaling;
  torch::manual_seed(2);
  const torch::Tensor x0 = (torch::randn({128, 160}) * 3).to(cuda, torch::kBFloat16),
                      w0 = (torch::randn({48, 160}) * 0.05).to(cuda),
                      b0 = torch::randn({48}).to(cuda), g0 = torch::randn({128, 48}).to(cuda);
  auto pass = [&](const torch::Tensor& xin, Fp8Scaling scaling, fabric::nn::Fp8History* history) {
    torch::Tensor x = xin.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                  b = b0.clone().requires_grad_();
    const torch::Tensor y = fabric::nn::fp8_linear(x, w, b, scaling, history);
    y.backward(g0.to(y.scalar_type()));
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  fabric::nn::Fp8History history(4);
  const auto first = pass(x0, Fp8Scaling::kDelayed, &history);
  const auto tensorwise = pass(x0, Fp8Scaling::kTensorwise, nullptr);
  for (size_t i = 0; i < first.size(); ++i)
    EXPECT_TRUE(torch::equal(first[i], tensorwise[i])) << "output/gradient " << i;
  EXPECT_LT(max_rel(first[3], g0.to(torch::kBFloat16).to(torch::kFloat).sum(0)), 1e-5);
  const torch::Tensor x2 = (x0.to(torch::kFloat) * 0.3).to(torch::kBFloat16);
  const auto second = pass(x2, Fp8Scaling::kDelayed, &history);
  const float a1 = x0.abs().amax().to(torch::kFloat).item<float>(),
              a2 = x2.abs().amax().to(torch::kFloat).item<float>();
  EXPECT_TRUE(torch::equal(history.amax[0].slice(0, 0, 3).cpu(), torch::tensor({a2, a1, a1})));
  EXPECT_EQ(history.amax.select(1, 4).abs().sum().item<float>(), 0.f);  // record slots cleared
  auto dequantized = [](const torch::Tensor& t, float amax) {
    const torch::Tensor tf = t.to(torch::kFloat).cpu();
    const torch::Tensor scale = 448.0 / torch::tensor(amax).clamp_min(1e-12);
    return (tf * scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn).to(torch::kFloat) / scale;
  };
  const torch::Tensor want =
      torch::matmul(dequantized(x2, a1), dequantized(w0, w0.abs().amax().item<float>()).t()) +
      b0.cpu();
  EXPECT_LT(max_rel(second[0].cpu(), want), 1e-2);  // bf16 output
  EXPECT_FALSE(torch::equal(second[0], pass(x2, Fp8Scaling::kTensorwise, nullptr)[0]));
}

// The GELU fused into the cast (fp8_linear's gelu_tanh_input; the GPT MLP's c_proj under
// fp8-mixed) against torch::gelu then fp8_linear on CUDA, bf16: the kernels compute the GELU as
// ATen's CUDA kernel does, in float32 rounded to bf16, but the compilers may contract its
// multiply-adds differently, and a last-bit difference can move a float8 rounding: so the
// product and gradients are compared within float8's precision, and how many product elements
// are bitwise equal is printed (expected: all, or nearly).
TEST(Fp8CudaTest, GeluFusedIntoTheCastMatchesGeluThenLinear) {
  SKIP_WITHOUT_CUDA();
  std::string why;
  const torch::Device cuda(torch::kCUDA, 0);
  if (!fabric::nn::fp8_supported(cuda, &why)) GTEST_SKIP() << why;
  torch::manual_seed(3);
  const torch::Tensor h0 = torch::randn({256, 512}).to(cuda, torch::kBFloat16),
                      w0 = (torch::randn({128, 512}) * 0.05).to(cuda),
                      b0 = torch::randn({128}).to(cuda),
                      g0 = torch::randn({256, 128}).to(cuda, torch::kBFloat16);
  auto run = [&](bool fused) {
    torch::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                  b = b0.clone().requires_grad_();
    const torch::Tensor y =
        fused ? fabric::nn::fp8_linear(h, w, b, fabric::nn::Fp8Scaling::kTensorwise, nullptr, true)
              : fabric::nn::fp8_linear(torch::gelu(h, "tanh"), w, b);
    y.backward(g0);
    return std::vector<torch::Tensor>{y.detach(), h.grad(), w.grad(), b.grad()};
  };
  const auto fused = run(true), plain = run(false);
  const double same = fused[0].eq(plain[0]).to(torch::kFloat).mean().item<double>();
  std::printf("gelu fused into the cast: %.4f%% of the product bitwise the unfused one\n",
              100 * same);
  EXPECT_GT(same, 0.99);
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_LT(relative_norm(fused[i], plain[i]), 1e-2) << "output/gradient " << i;
}

// FABRIC_FP8_CAST_GRID as it was, and the grid it names read again, when the scope ends (an
// assertion or a throwing launch included): later cases run on the process's grid.
struct CastGridRestore {
  std::optional<std::string> saved;
  CastGridRestore() {
    if (const char* v = std::getenv("FABRIC_FP8_CAST_GRID")) saved = v;
  }
  ~CastGridRestore() {
    if (saved)
      ::setenv("FABRIC_FP8_CAST_GRID", saved->c_str(), 1);
    else
      ::unsetenv("FABRIC_FP8_CAST_GRID");
    try {
      torch::nn::Module none;
      fabric::nn::convert_to_fp8(none, {});  // reads FABRIC_FP8_CAST_GRID
    } catch (const std::exception& e) {
      ADD_FAILURE() << e.what();
    }
  }
};

// The cast kernels' two grids (FABRIC_FP8_CAST_GRID): a resident wave of blocks, each casting
// several tiles with the next one's loads in flight (the default), and a block per tile. At
// gpt2-medium's operand sizes (16384 tokens x 1024 and 4096 features) a block of the wave casts
// several tiles, which the small shapes above never make it do: the product and all three
// gradients (the bias's from the cast's column sums) are bitwise the same, for both recipes.
TEST(Fp8CudaTest, CastGridsGiveTheSameBits) {
  SKIP_WITHOUT_CUDA();
  const CastGridRestore restore;
  std::string why;
  const torch::Device cuda(torch::kCUDA, 0);
  if (!fabric::nn::fp8_supported(cuda, &why)) GTEST_SKIP() << why;
  torch::manual_seed(3);
  for (const int64_t features : {1024, 4096}) {
    const torch::Tensor x0 = torch::randn({16384, features}).to(cuda, torch::kBFloat16),
                        w0 = (torch::randn({1024, features}) * 0.02).to(cuda),
                        b0 = torch::randn({1024}).to(cuda) * 0.1,
                        g0 = torch::randn({16384, 1024}).to(cuda, torch::kBFloat16);
    for (const auto scaling :
         {fabric::nn::Fp8Scaling::kTensorwise, fabric::nn::Fp8Scaling::kDelayed}) {
      std::vector<std::vector<torch::Tensor>> runs;
      for (const char* grid : {"tile", "wave"}) {
        ::setenv("FABRIC_FP8_CAST_GRID", grid, 1);
        torch::nn::Module none;
        fabric::nn::convert_to_fp8(none, {});  // reads FABRIC_FP8_CAST_GRID
        fabric::nn::Fp8History history;
        torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                      b = b0.clone().requires_grad_();
        const torch::Tensor y = fabric::nn::fp8_linear(x, w, b, scaling, &history);
        y.backward(g0);
        runs.push_back({y, x.grad(), w.grad(), b.grad()});
      }
      for (size_t i = 0; i < runs[0].size(); ++i)
        EXPECT_TRUE(torch::equal(runs[0][i], runs[1][i]))
            << "output/gradient " << i << ", " << features << " features, recipe "
            << static_cast<int>(scaling);
    }
  }
}

}  // namespace
