// Fabric's collectives with real processes (Gloo over loopback): strings/bytes, scalars, all_gather
// with unequal first dimensions, the exact metric on uneven data (10 examples, 3 ranks, batch 2),
// and a collective joined by only some ranks failing with its name instead of hanging.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "tests/run_command.h"

namespace {

fabric::testing::CommandResult run(const std::string& args) {
  const std::string exe = fabric::testing::helper_binary("//tests/integration:collectives_helper");
  return fabric::testing::run_command(exe + " " + args);
}

TEST(CollectivesTest, EveryCollectiveAndTheUnevenMetric) {
  for (const char* world : {"2", "3"}) {
    auto [code, out] = run(std::string(world) + " check");
    EXPECT_EQ(code, 0) << world << " ranks:\n" << out;
    EXPECT_NE(out.find("metric=0.4"), std::string::npos) << out;
  }
}

// The thread budget holds in every rank of a self-launched job: the CPUs it may use (FABRIC_CPUS
// here, so the test does not depend on the machine) divided by the ranks sharing them; then
// OMP_NUM_THREADS, then fabric.num_threads override it.
TEST(CollectivesTest, EveryRankRunsWithItsThreadBudget) {
  struct Case {
    std::string env, world, override_arg;
    int threads;
  };
  for (const Case& c : std::vector<Case>{{"FABRIC_CPUS=6", "2", "", 3},
                                         {"FABRIC_CPUS=6", "3", "", 2},
                                         {"FABRIC_CPUS=2", "3", "", 1},
                                         {"FABRIC_CPUS=6 OMP_NUM_THREADS=1", "2", "", 1},
                                         {"OMP_NUM_THREADS=1", "2", "fabric.num_threads=2", 2}}) {
    const std::string exe =
        fabric::testing::helper_binary("//tests/integration:collectives_helper");
    auto [code, out] = fabric::testing::run_command("env -u OMP_NUM_THREADS " + c.env + " " + exe +
                                                    " " + c.world + " threads " + c.override_arg);
    ASSERT_EQ(code, 0) << c.env << "\n" << out;
    const std::string n = std::to_string(c.threads);
    const std::string want = " threads " + n + " interop " + n + " other thread " + n + "\n";
    EXPECT_EQ(fabric::testing::ranks_missing_report(out, std::stoi(c.world), want),
              std::vector<int>{})
        << c.env << ": want \"rank R" << want << "\" from every rank\n"
        << out;
  }
}

TEST(CollectivesTest, ACollectiveOnlySomeRanksCallTimesOutNamingIt) {
  auto [code, out] = run("2 skip");
  EXPECT_NE(code, 0) << out;
  // Each rank says which collective it was in: kind, sequence number, dtype and shape.
  EXPECT_NE(out.find("error (rank 1): all_reduce(sum) #"), std::string::npos) << out;
  EXPECT_NE(out.find(" (float32 [1]) did not complete"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank must call the same collectives"), std::string::npos) << out;
}

// fabric.ddp.debug_collectives: the first collective that differs between ranks fails on both,
// naming both sides, long before the 3 s collective timeout would.
TEST(CollectivesTest, DebugCollectivesNamesTheFirstDivergence) {
  auto [code, out] = run("2 diverge");
  EXPECT_NE(code, 0) << out;
  EXPECT_NE(out.find("collective #3 differs between ranks: rank 0 calls all_reduce(sum) float32 "
                     "[4], rank 1 calls broadcast(from 0) float32 [4] "
                     "(fabric.ddp.debug_collectives)"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("passed the divergence"), std::string::npos) << out;
  auto reshaped = run("2 reshape");
  EXPECT_NE(reshaped.code, 0) << reshaped.out;
  EXPECT_NE(reshaped.out.find("rank 0 calls all_reduce(sum) float32 [4], rank 1 calls "
                              "all_reduce(sum) float32 [5]"),
            std::string::npos)
      << reshaped.out;
}

// trainer.stop_on_nonfinite: every rank stops at the same step, named after the rank that
// diverged; a shorter run of NaNs on another rank does not count.
TEST(CollectivesTest, NonFiniteLossesOnOneRankStopEveryRankAtTheSameStep) {
  auto [code, out] = run("3 nonfinite");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(fabric::testing::ranks_missing_report(
                out, 3,
                " stopped at step 9: the loss was not finite for 3 consecutive steps on rank 2 "
                "(detected at step 9; trainer.stop_on_nonfinite: 3)"),
            std::vector<int>{})
      << out;
}

// fabric::StopSignal: SIGTERM on one rank stops every rank at the same step, the first multiple of
// `every` (4) after the signal (step 6).
TEST(CollectivesTest, SigtermOnOneRankStopsEveryRankAtTheSameStep) {
  auto [code, out] = run("3 stopsignal");
  EXPECT_EQ(code, 0) << out;
  EXPECT_EQ(fabric::testing::ranks_missing_report(out, 3, " stopped at step 8"), std::vector<int>{})
      << out;
}

}  // namespace
