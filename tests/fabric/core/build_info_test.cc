#include "fabric/core/build_info.h"

#include <gtest/gtest.h>

namespace {

TEST(BuildInfoTest, TestsAreNotStampedSoCommitsKeepCachedResults) {
  EXPECT_EQ(fabric::build_info().revision, "unstamped");
}

TEST(BuildInfoTest, CompiledAsCxx20WithTheNewLibstdcxxAbi) {
  const fabric::BuildInfo& info = fabric::build_info();
  EXPECT_GE(info.cxx_standard, 202002L);
  // libtorch_configure detected the ABI from libc10.so; the 2.11 wheels use the new ABI.
  EXPECT_EQ(info.cxx11_abi, 1);
  EXPECT_FALSE(info.compiler.empty());
}

TEST(BuildInfoTest, CudaFlagFollowsTheBuildConfiguration) {
#ifdef FABRIC_WITH_CUDA
  EXPECT_TRUE(fabric::build_info().cuda_compiled);
#else
  EXPECT_FALSE(fabric::build_info().cuda_compiled);
#endif
}

}  // namespace
