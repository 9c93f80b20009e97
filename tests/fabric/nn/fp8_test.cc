// fabric::nn float8 GEMMs (fabric.precision: fp8-mixed) on the CPU's emulation: the product and
// both gradients close to float32's but not equal (they were quantized), dtypes as ATen's linear
// gives them (autocast included), sizes _scaled_mm cannot take computed exactly, what
// convert_to_fp8 converts and why it keeps the rest, the strategy's error for a model with
// nothing to convert, the cast grid's environment variable checked. (Delayed scaling and the
// fused GELU paths, each against its plain equivalent bitwise: fp8_equivalence_test.)
#include "fabric/nn/fp8.h"

#include <ATen/Context.h>
#include <ATen/ops/_scaled_mm.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/tensor_parallel.h"
#include "fabric/precision/autocast.h"
#include "fabric/precision/precision.h"
#include "strategies/single_device.h"

namespace {

double relative(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat) - b.to(torch::kFloat)).norm() / b.to(torch::kFloat).norm())
      .item<double>();
}

TEST(Fp8Test, ProductAndGradientsAreCloseToFloat32s) {
  torch::manual_seed(0);
  const torch::Tensor x0 = torch::randn({2, 16, 64}), w0 = torch::randn({48, 64}) * 0.1,
                      b0 = torch::randn({48});
  auto run = [&](bool fp8) {
    torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                  b = b0.clone().requires_grad_();
    torch::Tensor y = fp8 ? fabric::nn::fp8_linear(x, w, b) : torch::linear(x, w, b);
    (y * torch::linspace(-1, 1, 48)).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
  };
  const auto exact = run(false), fp8 = run(true);
  EXPECT_EQ(fp8[0].sizes(), exact[0].sizes());
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(fp8[i].scalar_type(), exact[i].scalar_type()) << i;
    // e4m3 keeps 3 mantissa bits, e5m2 2: a few percent, and never exact.
    EXPECT_LT(relative(fp8[i], exact[i]), i == 0 ? 0.06 : 0.15) << i;
  }
  EXPECT_GT(relative(fp8[0], exact[0]), 1e-4);
  EXPECT_GT(relative(fp8[2], exact[2]), 1e-4);
  EXPECT_LT(relative(fp8[3], exact[3]), 1e-6);  // the bias gradient is a plain sum
}

// On a CPU the float8 GEMM is computed as LibTorch's emulated _scaled_mm computes it (the
// library that defines the op is the reference): the product of fp8_linear equals _scaled_mm of
// the operands quantized as ATen's ops quantize them (fp8_cast.h: s = 448 / amax, q = (x · s)
// clamped and rounded to e4m3, scale 1 / s), bitwise. oneDNN is held off for the reference,
// so that LibTorch runs its emulation on CPUs with AMX too.
TEST(Fp8Test, CpuGemmIsLibTorchsEmulatedScaledMmBitwise) {
  torch::manual_seed(12);
  const torch::Tensor x = torch::randn({48, 64}) * 3, w = torch::randn({32, 64}) * 0.1,
                      b = torch::randn({32});
  auto quantized = [](const torch::Tensor& t) {
    const torch::Tensor s = 448.0 / t.abs().amax().to(torch::kFloat).clamp_min(1e-12);
    return std::make_pair((t.to(torch::kFloat) * s).clamp(-448.0, 448.0).to(torch::kFloat8_e4m3fn),
                          s.reciprocal());
  };
  const auto [qx, sx] = quantized(x);
  const auto [qw, sw] = quantized(w);
  const bool mkldnn = at::globalContext().userEnabledMkldnn();
  at::globalContext().setUserEnabledMkldnn(false);
  const torch::Tensor expected =
      at::_scaled_mm(qx, qw.t(), sx, sw, std::nullopt, std::nullopt, torch::kFloat) + b;
  at::globalContext().setUserEnabledMkldnn(mkldnn);
  EXPECT_TRUE(torch::equal(fabric::nn::fp8_linear(x, w, b), expected));
}

TEST(Fp8Test, UnderAutocastTheProductIsBf16AndMasterGradientsFloat32) {
  torch::Tensor w = (torch::randn({32, 64}) * 0.1).requires_grad_();
  torch::Tensor y;
  {
    fabric::AutocastGuard bf16(c10::DeviceType::CPU, c10::kBFloat16);
    y = fabric::nn::fp8_linear(torch::randn({16, 64}), w, torch::Tensor());
  }
  EXPECT_EQ(y.scalar_type(), c10::kBFloat16);
  y.to(torch::kFloat).sum().backward();
  EXPECT_EQ(w.grad().scalar_type(), c10::kFloat);
}

TEST(Fp8Test, SizesScaledMmCannotTakeAreComputedExactly) {
  const torch::Tensor x = torch::randn({10, 64}), w = torch::randn({32, 64});  // 10 rows
  EXPECT_TRUE(torch::equal(fabric::nn::fp8_linear(x, w, torch::Tensor()), torch::linear(x, w)));
}

// An empty batch (a rank's share of a short last batch) is linear's: no scale of nothing (the
// CPU's amax of no elements threw; CUDA's cast kernels left the scale unwritten).
TEST(Fp8Test, AnEmptyBatchIsLinearsWithZeroGradients) {
  const torch::Tensor x = torch::randn({0, 64}, torch::requires_grad());
  const torch::Tensor w = torch::randn({32, 64}, torch::requires_grad());
  const torch::Tensor y = fabric::nn::fp8_linear(x, w, torch::Tensor());
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 32}));
  y.sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), torch::zeros_like(w)));
}

struct Net : torch::nn::Module {
  Net() {
    register_module("fc", fabric::nn::Linear(64, 32));
    register_module("odd", fabric::nn::Linear(10, 32));
    register_module("plain", torch::nn::Linear(64, 32));
    register_module("head", fabric::nn::Linear(32, 16));
  }
};

TEST(Fp8Test, ConvertsFabricLinearsAndSaysWhyItKeptTheRest) {
  Net net;
  const auto c = fabric::nn::convert_to_fp8(net, {"head"});
  EXPECT_EQ(c.converted, std::vector<std::string>{"fc"});
  EXPECT_EQ(c.unfit, std::vector<std::string>{"odd"});
  EXPECT_EQ(c.plain, std::vector<std::string>{"plain"});
  EXPECT_EQ(c.excluded, std::vector<std::string>{"head"});
  EXPECT_TRUE(net.named_children()["fc"]->as<fabric::nn::LinearImpl>()->fp8());
  EXPECT_FALSE(net.named_children()["head"]->as<fabric::nn::LinearImpl>()->fp8());
  EXPECT_TRUE(c.unmatched.empty());
  // 'plain' is a torch::nn::Linear, 'HEAD' a typo: neither names a Linear float8 could take.
  Net other;
  EXPECT_EQ(fabric::nn::convert_to_fp8(other, {"head", "HEAD", "plain"}).unmatched,
            (std::vector<std::string>{"HEAD", "plain"}));
}

// auto_filter_small_kn keeps out the layers torchao's thresholds call too small (per scaling),
// beside the named patterns, and is never reported as a pattern that matched nothing.
TEST(Fp8Test, AutoFilterKeepsSmallLinearsOutByTorchaoThresholds) {
  struct Sizes : torch::nn::Module {
    Sizes() {
      register_module("square", fabric::nn::Linear(1024, 1024));  // in, out: both small
      register_module("wide", fabric::nn::Linear(1024, 4096));    // out > 1024
      register_module("down", fabric::nn::Linear(4096, 1024));    // in 4096, out 1024
      register_module("deep", fabric::nn::Linear(8192, 1024));    // in > 4096
      register_module("big", fabric::nn::Linear(2048, 8192));     // rowwise keeps only this
      register_module("named", fabric::nn::Linear(8192, 8192));   // excluded by name
    }
  };
  const std::vector<std::string> exclude = {"auto_filter_small_kn", "named"};
  Sizes a;
  const auto t = fabric::nn::convert_to_fp8(a, exclude, fabric::nn::Fp8Scaling::kTensorwise);
  EXPECT_EQ(t.converted, (std::vector<std::string>{"wide", "deep", "big"}));
  EXPECT_EQ(t.excluded, (std::vector<std::string>{"square", "down", "named"}));
  EXPECT_TRUE(t.unmatched.empty());
  Sizes b;
  const auto d = fabric::nn::convert_to_fp8(b, exclude, fabric::nn::Fp8Scaling::kDelayed);
  EXPECT_EQ(d.converted, t.converted) << "delayed scales per tensor: tensorwise's thresholds";
  Sizes c;
  const auto r = fabric::nn::convert_to_fp8(c, exclude, fabric::nn::Fp8Scaling::kRowwise);
  EXPECT_EQ(r.converted, std::vector<std::string>{"big"});
  Sizes none;
  EXPECT_EQ(fabric::nn::convert_to_fp8(none, {"named"}).converted.size(), 5u)
      << "without the entry nothing is kept out by size";
}

TEST(Fp8Test, SetupRefusesAnExcludePatternThatMatchesNoLinear) {
  auto precision =
      std::make_unique<fabric::Precision>(fabric::PrecisionMode::kFp8Mixed, c10::DeviceType::CPU);
  precision->set_fp8_exclude({"fc", "transformer.h.0.ATTN"});
  fabric::strategies::SingleDevice s(torch::kCPU, std::move(precision));
  Net net;
  try {
    s.setup_module(net);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "fabric.fp8.exclude_modules: 'transformer.h.0.ATTN' matches no fabric::nn::Linear "
                 "of the model; Linear names look like 'head' ('*' matches one name component; a "
                 "pattern names the Linear itself)");
    EXPECT_NE(dynamic_cast<const fabric::ConfigError*>(&e), nullptr) << "exit 2, as a config error";
  }
}

TEST(Fp8Test, RowwiseIsCarriedByTheConversionAndRefusedOnTheCpu) {
  Net net;
  fabric::nn::convert_to_fp8(net, {}, fabric::nn::Fp8Scaling::kRowwise);
  auto* fc = net.named_children()["fc"]->as<fabric::nn::LinearImpl>();
  EXPECT_EQ(fc->fp8_scaling(), fabric::nn::Fp8Scaling::kRowwise);
  try {
    fc->forward(torch::randn({16, 64}));
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "fabric.fp8.recipe: rowwise: float8 GEMMs with a scale per row run on CUDA only "
                 "(LibTorch's CPU _scaled_mm takes one scale per tensor); use tensorwise on cpu");
  }
  std::string why;
  EXPECT_FALSE(fabric::nn::fp8_supported(torch::kCPU, &why, fabric::nn::Fp8Scaling::kRowwise));
  EXPECT_EQ(why, "rowwise float8 scaling runs on CUDA only (the CPU's is tensorwise)");
  EXPECT_TRUE(fabric::nn::fp8_supported(torch::kCPU));
}

// fabric.fp8.fast_accumulation reaches the converted layers through the strategy's setup (on
// by default; its effect on the GEMMs is fp8_cuda_test's: the CPU's GEMM ignores it).
TEST(Fp8Test, SetupCarriesFastAccumulationToTheLayers) {
  for (const bool fast : {true, false}) {
    auto precision =
        std::make_unique<fabric::Precision>(fabric::PrecisionMode::kFp8Mixed, c10::DeviceType::CPU);
    if (!fast) precision->set_fp8_fast_accumulation(false);
    fabric::strategies::SingleDevice s(torch::kCPU, std::move(precision));
    Net net;
    s.setup_module(net);
    auto* fc = net.named_children()["fc"]->as<fabric::nn::LinearImpl>();
    EXPECT_TRUE(fc->fp8());
    EXPECT_EQ(fc->fp8_fast_accumulation(), fast);
  }
}

// fabric.fp8.grad_margin reaches each delayed layer's history through the strategy's setup (and
// a clone keeps it); the history refuses a margin out of range.
TEST(Fp8Test, SetupCarriesTheGradMarginToTheHistories) {
  for (const int64_t margin : {int64_t{3}, int64_t{0}}) {
    auto precision =
        std::make_unique<fabric::Precision>(fabric::PrecisionMode::kFp8Mixed, c10::DeviceType::CPU);
    precision->set_fp8_amax_history(4);  // delayed
    precision->set_fp8_grad_margin(margin);
    fabric::strategies::SingleDevice s(torch::kCPU, std::move(precision));
    Net net;
    s.setup_module(net);
    auto* fc = net.named_children()["fc"]->as<fabric::nn::LinearImpl>();
    ASSERT_TRUE(fc->fp8_history());
    EXPECT_EQ(fc->fp8_history()->grad_margin, margin);
    const auto copy = std::dynamic_pointer_cast<fabric::nn::LinearImpl>(fc->clone());
    EXPECT_EQ(copy->fp8_history()->grad_margin, margin);
  }
  try {
    fabric::nn::Fp8History(16, 16);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "fabric.fp8.grad_margin: 16; set a power of two from 0 to 15 (the default 3 "
                 "leaves the gradient 8x headroom)");
  }
}

// A gradient that outgrows its history by 5x (a learning-rate warm-up's jump): with margin 0
// its largest elements saturate to e5m2's largest and the input and weight gradients lose them;
// the default margin of 3 (8x headroom) casts it whole, as near the float32 gradients as
// tensorwise's own-amax scale. The seeding pass takes no margin (its tensorwise bits), and the
// recorded amaxes do not depend on it.
TEST(Fp8Test, DelayedGradMarginKeepsAGrowingGradientFromSaturating) {
  torch::manual_seed(9);
  const torch::Tensor x0 = torch::randn({64, 64}), w0 = torch::randn({32, 64}) * 0.1,
                      g0 = torch::randn({64, 32});
  auto pass = [&](const torch::Tensor& g, fabric::nn::Fp8Scaling scaling,
                  fabric::nn::Fp8History* history) {
    torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
    fabric::nn::fp8_linear(x, w, torch::Tensor(), scaling, history).backward(g);
    return std::vector<torch::Tensor>{x.grad(), w.grad()};
  };
  auto error = [](const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, ((got[i] - want[i]).norm() / want[i].norm()).item<double>());
    return worst;
  };
  const torch::Tensor g1 = g0 * 5;
  const std::vector<torch::Tensor> exact = {g1.mm(w0), g1.t().mm(x0)};
  fabric::nn::Fp8History none(4, 0), three(4);
  EXPECT_EQ(three.grad_margin, 3);
  // The seeding pass: tensorwise's bits whatever the margin.
  const auto seed = pass(g0, fabric::nn::Fp8Scaling::kDelayed, &three),
             seed0 = pass(g0, fabric::nn::Fp8Scaling::kDelayed, &none),
             tensorwise = pass(g0, fabric::nn::Fp8Scaling::kTensorwise, nullptr);
  for (size_t i = 0; i < seed.size(); ++i)
    EXPECT_TRUE(torch::equal(seed[i], tensorwise[i]) && torch::equal(seed0[i], tensorwise[i]));
  const double saturated = error(pass(g1, fabric::nn::Fp8Scaling::kDelayed, &none), exact);
  const double headroom = error(pass(g1, fabric::nn::Fp8Scaling::kDelayed, &three), exact);
  const double own = error(pass(g1, fabric::nn::Fp8Scaling::kTensorwise, nullptr), exact);
  std::cout << "5x gradient: relative error margin 0 " << saturated << ", margin 3 " << headroom
            << ", tensorwise " << own << "\n";
  EXPECT_GT(saturated, 0.2);
  EXPECT_LT(headroom, 2 * own);
  EXPECT_TRUE(torch::equal(none.amax, three.amax));  // the same amaxes recorded
}

TEST(Fp8Test, SetupRefusesAModelWithNothingToConvert) {
  fabric::strategies::SingleDevice s(
      torch::kCPU,
      std::make_unique<fabric::Precision>(fabric::PrecisionMode::kFp8Mixed, c10::DeviceType::CPU));
  torch::nn::Sequential plain(torch::nn::Linear(64, 32));
  try {
    s.setup_module(*plain);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "fabric.precision: fp8-mixed: the module has no Linear layer to run in float8 (1 "
                 "torch::nn::Linear, 0 excluded by fabric.fp8.exclude_modules, 0 with features "
                 "not a multiple of 16); build the layers as fabric::nn::Linear (same options and "
                 "parameters), or use bf16-mixed");
  }
  EXPECT_EQ(s.precision().autocast_dtype(), c10::kBFloat16);
}

// FABRIC_FP8_CAST_GRID picks the CUDA cast kernels' grid, read when a model is converted; a
// wrong value fails there, on a CPU too.
TEST(Fp8Test, CastGridEnvironmentVariableIsChecked) {
  Net net;
  ::setenv("FABRIC_FP8_CAST_GRID", "tile", 1);
  EXPECT_EQ(fabric::nn::convert_to_fp8(net, {}).converted.size(), 2u);
  ::setenv("FABRIC_FP8_CAST_GRID", "waves", 1);
  try {
    Net other;
    fabric::nn::convert_to_fp8(other, {});
    ADD_FAILURE() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "FABRIC_FP8_CAST_GRID='waves' is not a grid of fp8-mixed's cast kernels: set it "
                 "to wave (the default) or tile, or unset it");
  }
  ::unsetenv("FABRIC_FP8_CAST_GRID");
}

}  // namespace
