// strategies::DataParallel on its own: one process over several devices; the first holds the
// parameters. Built here with CPU devices (the Connector picks it only with 2+ CUDA devices; the
// replica mechanics are tested in tests/fabric/nn/data_parallel_test.cc).
#include "strategies/data_parallel.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <memory>
#include <vector>

#include "fabric/core/error.h"

namespace {

std::unique_ptr<fabric::Precision> fp32() {
  return std::make_unique<fabric::Precision>(fabric::PrecisionMode::k32True, c10::DeviceType::CPU);
}

TEST(DataParallelStrategyTest, OneProcessWhoseReplicaDevicesFabricForwardUses) {
  const std::vector<torch::Device> devices = {torch::Device(torch::kCPU, 0),
                                              torch::Device(torch::kCPU, 0)};
  fabric::strategies::DataParallel dp(devices, fp32());
  EXPECT_EQ(dp.name(), "dp");
  EXPECT_EQ(dp.world_size(), 1);
  EXPECT_EQ(dp.root_device(), devices.front());
  ASSERT_NE(dp.replica_devices(), nullptr);
  EXPECT_EQ(*dp.replica_devices(), devices);
  dp.setup_environment();
  const auto t = torch::arange(4);
  EXPECT_TRUE(torch::equal(dp.all_reduce(t, fabric::ReduceOp::kMean), t));
  EXPECT_TRUE(torch::equal(dp.broadcast(t, 0), t));
  EXPECT_THROW(dp.broadcast(t, 1), fabric::Error);
}

TEST(DataParallelStrategyTest, NoDevicesIsAnError) {
  EXPECT_THROW(fabric::strategies::DataParallel({}, fp32()), fabric::Error);
}

}  // namespace
