#include "fabric/precision/precision.h"

#include "fabric/core/error.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/optim/sgd.h>

namespace {

using fabric::Precision;
using fabric::PrecisionMode;

torch::Tensor matmul_output() {
  auto a = torch::ones({4, 4});
  return torch::mm(a, a);
}

TEST(AutocastGuardTest, EnablesNestsAndRestores) {
  const auto original_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  {
    fabric::AutocastGuard outer(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_EQ(matmul_output().scalar_type(), at::kBFloat16);
    {
      fabric::AutocastGuard inner(c10::DeviceType::CPU, at::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(matmul_output().scalar_type(), at::kFloat);
    }
    EXPECT_EQ(matmul_output().scalar_type(), at::kBFloat16);
    {
      fabric::AutocastGuard half(c10::DeviceType::CPU, at::kHalf);
      EXPECT_EQ(matmul_output().scalar_type(), at::kHalf);
    }
    EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(at::autocast::get_autocast_dtype(at::kCPU), original_dtype);
  EXPECT_EQ(matmul_output().scalar_type(), at::kFloat);
}

TEST(AutocastGuardTest, MovedGuardRestoresOnce) {
  {
    fabric::AutocastGuard a(c10::DeviceType::CPU, at::kBFloat16);
    fabric::AutocastGuard b(std::move(a));
    EXPECT_FALSE(a.active());
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST(PrecisionTest, NamesRoundTrip) {
  for (const char* name : {"32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true"})
    EXPECT_EQ(fabric::to_string(fabric::parse_precision(name)), name);
  EXPECT_THROW(fabric::parse_precision("16"), fabric::Error);
}

TEST(PrecisionTest, OnlyMixedModesAutocast) {
  EXPECT_FALSE(Precision(PrecisionMode::k32True, c10::DeviceType::CPU).autocast().active());
  EXPECT_FALSE(Precision(PrecisionMode::kBf16True, c10::DeviceType::CPU).autocast().active());
  Precision bf16(PrecisionMode::kBf16Mixed, c10::DeviceType::CPU);
  {
    auto guard = bf16.autocast();
    EXPECT_EQ(matmul_output().scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(matmul_output().scalar_type(), at::kFloat);
  EXPECT_EQ(bf16.scaler(), nullptr);
  EXPECT_NE(Precision(PrecisionMode::k16Mixed, c10::DeviceType::CUDA).scaler(), nullptr);
}

TEST(PrecisionTest, TrueModesConvertModulesAndFloatingInputs) {
  struct Case {
    PrecisionMode mode;
    at::ScalarType dtype;
  };
  for (auto c :
       {Case{PrecisionMode::k32True, at::kFloat}, Case{PrecisionMode::k64True, at::kDouble},
        Case{PrecisionMode::kBf16True, at::kBFloat16}, Case{PrecisionMode::k16True, at::kHalf},
        Case{PrecisionMode::k16Mixed, at::kFloat}, Case{PrecisionMode::kBf16Mixed, at::kFloat}}) {
    Precision precision(c.mode, c10::DeviceType::CPU);
    torch::nn::BatchNorm1d bn(3);
    precision.convert_module(*bn);
    EXPECT_EQ(bn->weight.scalar_type(), c.dtype) << fabric::to_string(c.mode);
    EXPECT_EQ(bn->running_mean.scalar_type(), c.dtype) << fabric::to_string(c.mode);
    EXPECT_EQ(bn->num_batches_tracked.scalar_type(), at::kLong) << "integer buffers stay integer";
    EXPECT_EQ(precision.convert_input(torch::ones({2})).scalar_type(), c.dtype);
    EXPECT_EQ(precision.convert_input(torch::ones({2}, torch::kLong)).scalar_type(), at::kLong);
  }
}

TEST(PrecisionTest, SixteenMixedStepMatchesThePlainStepOnCpu) {
  // 16-mixed scales the loss by 65536 and unscales before stepping: on CPU (no autocast dtype
  // change for these ops) the result equals an unscaled fp32 step bitwise.
  Precision mixed(PrecisionMode::k16Mixed, c10::DeviceType::CPU);
  Precision plain(PrecisionMode::k32True, c10::DeviceType::CPU);
  auto a = torch::tensor({0.5f, -1.5f, 3.0f}, torch::requires_grad());
  auto b = a.detach().clone().requires_grad_(true);
  torch::optim::SGD sa({a}, torch::optim::SGDOptions(0.25).momentum(0.5));
  torch::optim::SGD sb({b}, torch::optim::SGDOptions(0.25).momentum(0.5));
  for (int i = 0; i < 3; ++i) {
    sa.zero_grad();
    sb.zero_grad();
    mixed.backward((a * a * 3).sum());
    plain.backward((b * b * 3).sum());
    EXPECT_TRUE(mixed.optimizer_step(sa));
    EXPECT_TRUE(plain.optimizer_step(sb));
    EXPECT_TRUE(torch::equal(a.detach(), b.detach())) << "step " << i;
  }
  EXPECT_EQ(mixed.scaler()->get_scale(), 65536.0);
}

}  // namespace
