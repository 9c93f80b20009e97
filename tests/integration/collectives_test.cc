// Fabric's collectives with real processes (Gloo over loopback): strings/bytes, scalars, all_gather
// with unequal first dimensions, the exact metric on uneven data (10 examples, 3 ranks, batch 2),
// and a collective joined by only some ranks failing with its name instead of hanging.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/run_command.h"

namespace {

fabric::testing::CommandResult run(const std::string& args) {
  const std::string exe =
      (std::filesystem::current_path() / "tests" / "collectives_helper").string();
  return fabric::testing::run_command(exe + " " + args);
}

TEST(CollectivesTest, EveryCollectiveAndTheUnevenMetric) {
  for (const char* world : {"2", "3"}) {
    auto [code, out] = run(std::string(world) + " check");
    EXPECT_EQ(code, 0) << world << " ranks:\n" << out;
    EXPECT_NE(out.find("metric=0.4"), std::string::npos) << out;
  }
}

TEST(CollectivesTest, ACollectiveOnlySomeRanksCallTimesOutNamingIt) {
  auto [code, out] = run("2 skip");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("error (rank 1): all_reduce did not complete"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank must call the same collectives"), std::string::npos) << out;
}

}  // namespace
