#include "fabric/accelerators/cpu_info.h"

#include <gtest/gtest.h>

namespace {

TEST(CpuInfoTest, NativeBf16ComesFromTheCpuFlags) {
  fabric::CpuInfo info;
  fabric::parse_cpuinfo(
      "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8481C\n"
      "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\n"
      "processor\t: 1\nflags\t\t: fpu avx2\n",
      info);
  EXPECT_TRUE(info.native_bf16);
  EXPECT_EQ(info.bf16_flags, "amx_bf16 avx512_bf16");
  EXPECT_EQ(info.model, "Intel(R) Xeon(R) Platinum 8481C");

  fabric::CpuInfo avx512;  // AVX-512 without bf16 (Skylake/Cascade Lake): emulated
  fabric::parse_cpuinfo("flags\t: fpu avx2 avx512f avx512bw avx512_vnni\n", avx512);
  EXPECT_FALSE(avx512.native_bf16);
  EXPECT_EQ(avx512.bf16_flags, "");

  fabric::CpuInfo arm;  // aarch64 lists its features under "Features"
  fabric::parse_cpuinfo("Features\t: fp asimd sve bf16 i8mm\n", arm);
  EXPECT_TRUE(arm.native_bf16);
}

TEST(CpuInfoTest, UsableCpusAreTheAffinityMaskCappedByTheCgroupQuota) {
  EXPECT_EQ(fabric::parse_cpu_max("250000 100000\n"), 2.5);
  EXPECT_EQ(fabric::parse_cpu_max("max 100000\n"), std::nullopt);
  EXPECT_EQ(fabric::parse_cpu_max(""), std::nullopt);
  fabric::CpuInfo info;
  EXPECT_EQ(info.usable(), 0);  // unknown
  info.online = 16;
  EXPECT_EQ(info.usable(), 16);
  info.affinity = 4;
  EXPECT_EQ(info.usable(), 4);
  info.quota = 2.5;
  EXPECT_EQ(info.usable(), 3);
  info.quota = 0.5;
  EXPECT_EQ(info.usable(), 1);
  info.quota = 8.0;
  EXPECT_EQ(info.usable(), 4);
}

TEST(CpuInfoTest, CountsAsOpenMpWritesThem) {
  EXPECT_EQ(fabric::parse_cpu_count("4"), 4);
  EXPECT_EQ(fabric::parse_cpu_count("6,2"), 6);
  EXPECT_EQ(fabric::parse_cpu_count("0"), std::nullopt);
  EXPECT_EQ(fabric::parse_cpu_count("lots"), std::nullopt);
  EXPECT_EQ(fabric::parse_cpu_count("4x"), std::nullopt);
  EXPECT_EQ(fabric::parse_cpu_count(""), std::nullopt);
}

TEST(CpuInfoTest, ThisMachineIsRead) {
  const fabric::CpuInfo info = fabric::query_cpu_info();
  EXPECT_GE(info.online, 1);
  EXPECT_GE(info.affinity, 1);
  EXPECT_LE(info.affinity, info.online);
  EXPECT_GE(info.usable(), 1);
}

}  // namespace
