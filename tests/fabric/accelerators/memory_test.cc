// Tensor memory accounting on the CPU: what tensors hold is counted, the peak follows, and an
// allocation past the limit throws the out-of-memory error CUDA throws (and leaves no count).
#include "fabric/accelerators/memory.h"

#include <gtest/gtest.h>
#include <torch/types.h>

#include <stdexcept>

namespace {

TEST(Memory, CountsCpuTensorsAndTheirPeak) {
  const c10::Device cpu(c10::kCPU);
  const int64_t before = fabric::memory_stats(cpu).allocated;
  fabric::reset_peak_memory(cpu);
  {
    torch::Tensor a = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
    EXPECT_EQ(fabric::memory_stats(cpu).allocated - before, 4 << 20);
    torch::Tensor b = torch::empty({1 << 19}, torch::kDouble);  // 4 MiB
    EXPECT_EQ(fabric::memory_stats(cpu).allocated - before, 8 << 20);
  }
  EXPECT_EQ(fabric::memory_stats(cpu).allocated, before);
  EXPECT_GE(fabric::memory_stats(cpu).peak - before, 8 << 20);
  fabric::reset_peak_memory(cpu);
  EXPECT_EQ(fabric::memory_stats(cpu).peak, before);
}

TEST(Memory, AnAllocationPastTheLimitIsAnOutOfMemoryError) {
  const c10::Device cpu(c10::kCPU);
  const int64_t before = fabric::memory_stats(cpu).allocated;
  fabric::set_memory_limit(cpu, before + (16 << 20));
  EXPECT_EQ(fabric::memory_stats(cpu).limit, before + (16 << 20));
  torch::Tensor fits = torch::ones({2 << 20});  // 8 MiB
  try {
    torch::Tensor too_much = torch::ones({3 << 20});  // 12 MiB more
    FAIL() << "no error";
  } catch (const c10::OutOfMemoryError& e) {
    EXPECT_TRUE(fabric::is_out_of_memory(e));
    EXPECT_NE(std::string(e.what()).find("CPU out of memory: tried to allocate 12.0 MiB"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fabric::memory_stats(cpu).allocated - before, 8 << 20);  // the refusal left no count
  fabric::set_memory_limit(cpu, 0);
  torch::Tensor now_fits = torch::ones({3 << 20});
  EXPECT_EQ(fabric::memory_stats(cpu).limit, 0);
  EXPECT_FALSE(fabric::is_out_of_memory(std::runtime_error("x")));
}

TEST(Memory, SizesAsText) {
  EXPECT_EQ(fabric::parse_bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(fabric::parse_bytes("1.5 GB"), 1500000000LL);
  EXPECT_EQ(fabric::parse_bytes("2gib"), 2LL << 30);
  EXPECT_EQ(fabric::parse_bytes("1048576"), 1048576);
  EXPECT_EQ(fabric::parse_bytes("300KB"), 300000);
  EXPECT_THROW(fabric::parse_bytes("lots"), std::invalid_argument);
  EXPECT_THROW(fabric::parse_bytes("3 GiBs"), std::invalid_argument);
  EXPECT_EQ(fabric::format_bytes(3LL << 29), "1.50 GiB");
  EXPECT_EQ(fabric::format_bytes(12 << 20), "12.0 MiB");
  EXPECT_EQ(fabric::format_bytes(512), "512 B");
}

}  // namespace
