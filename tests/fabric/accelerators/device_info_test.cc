#include "fabric/accelerators/device_info.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>

#include "fabric/core/build_info.h"

namespace {

TEST(DeviceInfoTest, LoadedLibTorchMatchesTheHeadersWeCompiledAgainst) {
  const fabric::RuntimeInfo info = fabric::query_runtime_info();
  EXPECT_EQ(info.libtorch_version, fabric::build_info().libtorch_headers);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(info.libtorch_dir) / "libc10.so"))
      << info.libtorch_dir;
  EXPECT_NE(info.cpu_capability, "unknown");
}

TEST(DeviceInfoTest, ThreadCountsAreQueriedAfresh) {
  const int before = at::get_num_threads();
  EXPECT_EQ(fabric::query_runtime_info().intra_op_threads, before);
  at::set_num_threads(1);
  EXPECT_EQ(fabric::query_runtime_info().intra_op_threads, 1);
  at::set_num_threads(before);
  EXPECT_GT(fabric::query_runtime_info().inter_op_threads, 0);
}

// LIBTORCH_IS_CUDA_BUILD comes from @libtorch//:info.bzl (whether libtorch_cuda.so was found).
TEST(DeviceInfoTest, CudaPartIsLoadedExactlyWhenTheBuildAsksForIt) {
  const fabric::RuntimeInfo info = fabric::query_runtime_info();
#if defined(FABRIC_WITH_CUDA)
  // Proves libtorch_cuda is linked with --no-as-needed: nothing references it by symbol.
  EXPECT_TRUE(info.libtorch_has_cuda);
  ASSERT_TRUE(info.cuda_runtime_version.has_value());
  EXPECT_EQ(info.cuda_runtime_version->rfind("13.", 0), 0u) << *info.cuda_runtime_version;
  EXPECT_TRUE(info.cudnn_version.has_value());
#else
  // --config=cpu_only (or a CPU LibTorch): libtorch_cuda must not even be loaded.
  EXPECT_FALSE(info.libtorch_has_cuda);
  EXPECT_FALSE(info.cuda_available);
  EXPECT_FALSE(info.cuda_runtime_version.has_value());
  EXPECT_FALSE(LIBTORCH_IS_CUDA_BUILD && fabric::build_info().cuda_compiled);
#endif
  EXPECT_EQ(info.cuda_available, torch::cuda::is_available());
  EXPECT_EQ(static_cast<int64_t>(info.devices.size()),
            info.cuda_available ? static_cast<int64_t>(torch::cuda::device_count()) : 0);
}

TEST(DeviceInfoTest, FormatsVendorVersionNumbers) {
  EXPECT_EQ(fabric::format_cudnn_version(91900), "9.19.0");
  EXPECT_EQ(fabric::format_cudnn_version(90102), "9.1.2");
  EXPECT_EQ(fabric::format_cuda_version(13000), "13.0");
  EXPECT_EQ(fabric::format_cuda_version(12080), "12.8");
}

TEST(DeviceInfoTest, ReadsWholeKeysFromBuildSettings) {
  const std::string config =
      "  - Build settings: BLAS_INFO=mkl, XTORCH_VERSION=9.9.9, TORCH_VERSION=2.11.0, USE_CUDA=ON, "
      "\n";
  EXPECT_EQ(fabric::build_setting(config, "TORCH_VERSION"), "2.11.0");
  EXPECT_EQ(fabric::build_setting(config, "BLAS_INFO"), "mkl");
  EXPECT_EQ(fabric::build_setting(config, "USE_CUDA"), "ON");
  EXPECT_EQ(fabric::build_setting(config, "USE_ROCM"), std::nullopt);
}

}  // namespace
