// DDP with real processes (Gloo over loopback): parity with one process on the concatenated
// batches for 2 and 4 ranks (many small buckets), no_backward_sync accumulation,
// find_unused_parameters, static_graph and the bf16 compression hook; the capturable gradient sync
// (all-reduce after backward, for CUDA graphs) bitwise equal to the Reducer's.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace {

fabric::testing::CommandResult run(const std::string& args) {
  const std::string exe = fabric::testing::helper_binary("//tests/integration:ddp_parity_helper");
  return fabric::testing::run_command(exe + " " + args);
}

TEST(DdpTest, MatchesOneProcessOnTheConcatenatedBatches) {
  for (const char* world : {"2", "4"}) {
    auto [code, out] = run(std::string(world) + " 6 plain");
    EXPECT_EQ(code, 0) << world << " ranks: " << out;
    EXPECT_NE(out.find("max_rel_diff="), std::string::npos) << out;
  }
}

TEST(DdpTest, NoBackwardSyncAccumulatesWithoutCommunicating) {
  auto [code, out] = run("2 4 nosync");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("collective issued inside no_backward_sync"), std::string::npos) << out;
}

// Every backward of a step inside no_backward_sync: the step averages the accumulated gradients
// (each rank stepped with its own before: replicas drifted apart silently).
TEST(DdpTest, AStepAfterOnlyUnsyncedBackwardsAveragesFirst) {
  for (const char* mode : {"allnosync", "flat_allnosync"}) {
    auto [code, out] = run(std::string("2 4 ") + mode);
    EXPECT_EQ(code, 0) << mode << ": " << out;
    EXPECT_NE(out.find("max_rel_diff="), std::string::npos) << out;
  }
}

TEST(DdpTest, FindUnusedParametersDoesNotHangAndLeavesUnusedLayersAlone) {
  auto [code, out] = run("2 3 unused");
  EXPECT_EQ(code, 0) << out;
}

TEST(DdpTest, StaticGraphMatchesOneProcess) {
  auto [code, out] = run("2 4 static");
  EXPECT_EQ(code, 0) << out;
}

TEST(DdpTest, Bf16CompressionHookStaysCloseToOneProcess) {
  auto [code, out] = run("2 4 bf16");
  EXPECT_EQ(code, 0) << out;
}

// The gradient sync that CUDA graphs capture (strategies/flat_gradient_sync.h) averages exactly as
// the Reducer does: the trained parameters' bits are equal, plain and with the bf16 hook, for 2
// and 3 ranks (the all-reduce sums each element in rank order), and no_backward_sync still skips
// it.
TEST(DdpTest, CapturableGradientSyncIsBitwiseTheReducers) {
  for (const char* world : {"2", "3"}) {
    for (const char* mode : {"plain", "bf16"}) {
      SCOPED_TRACE(std::string(world) + " ranks, " + mode);
      auto reducer = run(std::string(world) + " 5 " + mode);
      auto flat = run(std::string(world) + " 5 flat_" + mode);
      ASSERT_EQ(reducer.code, 0) << reducer.out;
      ASSERT_EQ(flat.code, 0) << flat.out;
      const std::string expected = fabric::testing::value_after(reducer.out, "params_hash=");
      ASSERT_FALSE(expected.empty()) << reducer.out;
      EXPECT_EQ(fabric::testing::value_after(flat.out, "params_hash="), expected)
          << flat.out << reducer.out;
    }
  }
  auto [code, out] = run("2 4 flat_nosync");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(out.find("collective issued inside no_backward_sync"), std::string::npos) << out;
}

// A captured step needs every gradient in every step: a parameter forward never uses is named.
TEST(DdpTest, CapturableGradientSyncNamesAParameterWithoutAGradient) {
  auto [code, out] = run("2 2 flat_unused");
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("error: ddp: parameter 'unused.weight' has no gradient after backward on "
                     "rank 0; a captured step (fabric.cuda_graphs) needs a gradient for every "
                     "parameter in every step"),
            std::string::npos)
      << out;
}

}  // namespace
