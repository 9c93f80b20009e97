// GPU smoke test (tag `gpu`; run with `bazel test --config=gpu`). Skips with a reason where no CUDA
// device exists; never passes silently.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include "fabric/accelerators/device_info.h"

namespace {

void skip_without_cuda() {
#ifndef FABRIC_WITH_CUDA
  GTEST_SKIP() << "built without CUDA (--config=cpu_only or a CPU-only LibTorch)";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device on this machine";
#endif
}

TEST(CudaSmokeTest, AutogradOnTheGpuMatchesTheCpuBitwise) {
  skip_without_cuda();
  if (IsSkipped()) return;
  auto run = [](torch::Device device) {
    auto x = torch::tensor({1.0f, -2.0f, 0.5f, 4.0f}, torch::device(device).requires_grad(true));
    auto w = torch::tensor({3.0f, 0.25f, -1.0f, 2.0f}, torch::device(device).requires_grad(true));
    (w * x.pow(2) + 3 * x).sum().backward();
    return std::make_pair(x.grad().cpu(), w.grad().cpu());
  };
  auto [gx_cpu, gw_cpu] = run(torch::kCPU);
  auto [gx_gpu, gw_gpu] = run(torch::kCUDA);
  EXPECT_TRUE(torch::equal(gx_cpu, gx_gpu));
  EXPECT_TRUE(torch::equal(gw_cpu, gw_gpu));
}

TEST(CudaSmokeTest, DeviceInfoDescribesEveryDevice) {
  skip_without_cuda();
  if (IsSkipped()) return;
  const fabric::RuntimeInfo info = fabric::query_runtime_info();
  ASSERT_TRUE(info.cuda_available);
  ASSERT_EQ(static_cast<int64_t>(info.devices.size()), torch::cuda::device_count());
  for (const auto& d : info.devices) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GT(d.capability_major, 0);
    EXPECT_GT(d.total_memory_bytes, 0);
  }
  EXPECT_TRUE(info.nccl_version.has_value());
  EXPECT_TRUE(info.cudnn_version.has_value());
}

TEST(CudaSmokeTest, HalfPrecisionMatmulRuns) {
  skip_without_cuda();
  if (IsSkipped()) return;
  auto a = torch::ones({64, 64}, torch::device(torch::kCUDA).dtype(torch::kHalf));
  auto c = torch::mm(a, a);
  EXPECT_EQ(c.dtype(), torch::kHalf);
  EXPECT_TRUE(torch::equal(c.cpu(), torch::full({64, 64}, 64.0, torch::kHalf)));
}

}  // namespace
