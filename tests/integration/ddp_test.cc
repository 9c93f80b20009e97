// DDP with real processes (Gloo over loopback): parity with one process on the concatenated
// batches for 2 and 4 ranks (many small buckets), no_backward_sync accumulation,
// find_unused_parameters, static_graph and the bf16 compression hook.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace {

fabric::testing::CommandResult run(const std::string& args) {
  const std::string exe =
      (std::filesystem::current_path() / "tests" / "ddp_parity_helper").string();
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

}  // namespace
