// fabric::nn float8 GEMMs (fabric.precision: fp8-mixed) on the CPU's _scaled_mm: the product and
// both gradients close to float32's but not equal (they were quantized), dtypes as ATen's linear
// gives them (autocast included), sizes _scaled_mm cannot take computed exactly, what
// convert_to_fp8 converts and why it keeps the rest, and the strategy's error for a model with
// nothing to convert.
#include "fabric/nn/fp8.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

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

}  // namespace
