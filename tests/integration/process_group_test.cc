// Real processes over loopback: self-launch + TCPStore on an ephemeral port + Gloo collectives.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <string>

#include "tests/run_command.h"

namespace {

using Result = fabric::testing::CommandResult;

Result run_job(int world) {
  const std::string exe =
      fabric::testing::helper_binary("//tests/integration:process_group_helper");
  return fabric::testing::run_command(exe + " " + std::to_string(world));
}

TEST(ProcessGroupTest, GlooCollectivesAcrossTwoAndFourProcesses) {
  for (int world : {2, 4}) {
    Result r = run_job(world);
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(fabric::testing::ranks_missing_report(r.out, world,
                                                    " of " + std::to_string(world) + ": ok"),
              std::vector<int>{})
        << r.out;
  }
}

TEST(ProcessGroupTest, ThreeJobsAtOnceNeverCollideOnPorts) {
  std::vector<std::future<Result>> jobs;
  for (int i = 0; i < 3; ++i)
    jobs.push_back(std::async(std::launch::async, [] { return run_job(2); }));
  for (auto& job : jobs) {
    Result r = job.get();
    EXPECT_EQ(r.code, 0) << r.out;
  }
}

}  // namespace
