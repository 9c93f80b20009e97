// SyncBatchNorm with real processes (Gloo over loopback): 2 and 3 ranks with unequal and empty
// per-rank batches equal torch::nn::BatchNorm on the concatenated batch (outputs, input and
// weight/bias gradients after DDP, running statistics) within 1e-5.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace {

void expect_parity(const std::string& args) {
  const std::string exe =
      fabric::testing::helper_binary("//tests/integration:sync_batchnorm_helper");
  auto [code, out] = fabric::testing::run_command(exe + " " + args);
  EXPECT_EQ(code, 0) << args << ":\n" << out;
  EXPECT_NE(out.find("max_abs_diff="), std::string::npos) << out;
}

TEST(SyncBatchNormTest, TwoRanksUnequalBatches) { expect_parity("2d 3 5"); }
TEST(SyncBatchNormTest, ThreeRanksUnequalBatches) { expect_parity("2d 2 1 5"); }
TEST(SyncBatchNormTest, ARankWithAnEmptyBatch) { expect_parity("2d 4 0 3"); }
// The fused CPU kernels take channels-last and bf16 input (bf16-mixed) as they come.
TEST(SyncBatchNormTest, ChannelsLastAndBf16Inputs) {
  expect_parity("2d_cl 3 5");
  expect_parity("2d_bf16 3 5");
  expect_parity("2d_bf16 4 0 3");
}

TEST(SyncBatchNormTest, OneAndThreeDimensionalVariants) {
  expect_parity("1d 3 5");
  expect_parity("3d 2 1 2");
}

}  // namespace
