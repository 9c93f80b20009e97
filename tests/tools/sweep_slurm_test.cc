// //tools:sweep --launcher=slurm against a one-machine SLURM cluster (tools/slurm_local.sh):
// a job array gives the local sweep's results, failed and cancelled runs are retried, --no_wait
// and gathering, Ctrl-C cancels the array.
#include "tests/slurm_cluster.h"
#include "tests/tools/sweep_testing.h"

namespace {

using fabric::testing::lines;
using fabric::testing::read;
using fabric::testing::SweepTest;
namespace fs = std::filesystem;

// --launcher=slurm on a one-machine cluster (Debian's slurm-wlm; the only reason to skip is that it
// is not installed): the pending runs go out as one job array and come back into the same state
// file and tables as a local sweep's.
class SlurmSweepTest : public SweepTest {
 protected:
  static void SetUpTestSuite() { cluster_.start(); }
  static void TearDownTestSuite() { cluster_.stop(); }
  void SetUp() override {
    if (cluster_.missing()) GTEST_SKIP() << cluster_.why();
    ASSERT_TRUE(cluster_.started()) << cluster_.why();
    SweepTest::SetUp();
  }
  static bool alive(pid_t pid) { return kill(pid, 0) == 0; }
  // Waits (bounded: 60 s) until `pid` is gone.
  static bool gone(pid_t pid) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (alive(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return !alive(pid);
  }
  static inline fabric::testing::LocalSlurm cluster_;
};

constexpr const char* kTwoRuns =
    "grid:\n  optimizer.lr: [0.1, 0.3]\nseeds: [1]\nmetric: fake_metric\nmode: max\n";

// Cells 0, 1, 2, 4, 5, 6 of each results.csv row (run, status, exit code, lr, seed, metric): all
// but the attempts and what follows the metric.
std::vector<std::string> outcome(const std::string& csv) {
  std::vector<std::string> out;
  for (const auto& row : lines(csv)) {
    std::istringstream in(row);
    std::vector<std::string> c;
    for (std::string cell; std::getline(in, cell, ',');) c.push_back(cell);
    c.resize(7);
    out.push_back(c[0] + "," + c[1] + "," + c[2] + "," + c[4] + "," + c[5] + "," + c[6]);
  }
  return out;
}

TEST_F(SlurmSweepTest, AJobArrayGivesTheLocalResultsAndARerunRetriesOnlyTheFailedRun) {
  write_sweep(kTwoRuns);
  auto r = sweep("FAKE_FAIL_LR=0.3", "--launcher=slurm");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("submitted 2 run(s) as SLURM job array"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAILED lr=0.3_seed=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: fake failure at lr 0.300000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 done, 1 failed, 0 not run"), std::string::npos) << r.out;
  const std::string script = read(dir_ / "out" / "slurm" / "array.sh");
  EXPECT_NE(script.find("#SBATCH --array=0-1\n"), std::string::npos) << script;
  auto s = state();
  EXPECT_EQ(s["runs"]["lr=0.1_seed=1"]["status"], "done");
  EXPECT_EQ(s["runs"]["lr=0.3_seed=1"]["status"], "failed");
  const std::string job0 = s["runs"]["lr=0.1_seed=1"]["slurm_job"];
  const std::string job1 = s["runs"]["lr=0.3_seed=1"]["slurm_job"];
  ASSERT_NE(job0.find('_'), std::string::npos) << job0;
  EXPECT_EQ(job0.substr(0, job0.find('_')) + "_1", job1) << "one array, element per run";

  r = sweep("", "--launcher=slurm");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("submitted 1 run(s)"), std::string::npos) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 3u) << r.out;
  EXPECT_EQ(calls[2], "0.3 1");
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=1"]["attempts"], 2);
  EXPECT_TRUE(fs::exists(dir_ / "out" / "runs" / "lr=0.3_seed=1" / "summary.json"));

  // The same sweep run locally: the same outcome, run by run.
  r = fabric::testing::run_command(command("", "", "local"));
  EXPECT_EQ(r.code, 0) << r.out;
  const auto slurm_rows = outcome(read(dir_ / "out" / "results.csv"));
  EXPECT_EQ(slurm_rows.size(), 3u);
  EXPECT_EQ(slurm_rows, outcome(read(dir_ / "local" / "results.csv")));

  r = sweep("", "--launcher=slurm");  // all done: nothing is submitted
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.find("submitted"), std::string::npos) << r.out;
  EXPECT_EQ(invocations().size(), 5u);  // 3 through SLURM + the 2 local ones
}

TEST_F(SlurmSweepTest, NoWaitReturnsAndALaterInvocationGathersAndRetriesACancelledRun) {
  write_sweep(kTwoRuns);
  const fs::path started = dir_ / "started";
  auto r = sweep("FAKE_BLOCK_LR=0.3 FAKE_STARTED='" + started.string() + "'",
                 "--launcher=slurm --no_wait");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 queued or running in SLURM"), std::string::npos) << r.out;
  const std::string job = state()["runs"]["lr=0.3_seed=1"]["slurm_job"];
  const std::string blocked = wait_for_line(started);
  ASSERT_FALSE(blocked.empty()) << "the blocking run never started";

  // While its run is in SLURM, the local launcher refuses, naming the job.
  r = sweep();
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(
      r.out.find("still queued or running in SLURM (job " + job.substr(0, job.find('_')) + ")"),
      std::string::npos)
      << r.out;

  // The user cancels it; the next invocation records how it ended and runs it again.
  EXPECT_EQ(fabric::testing::run_command("scancel " + job).code, 0);
  EXPECT_TRUE(gone(std::stoi(blocked))) << "scancel must stop the run";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (fabric::testing::run_command("squeue -h -r --me -o %i | grep -qx " + job).code == 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  r = sweep("", "--launcher=slurm");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("FAILED lr=0.3_seed=1"), std::string::npos) << "gathered: " << r.out;
  EXPECT_NE(r.out.find("2 done, 0 failed, 0 not run"), std::string::npos) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 3u) << r.out;
  EXPECT_EQ(calls[2], "0.3 1");
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=1"]["attempts"], 2);
}

TEST_F(SlurmSweepTest, InterruptCancelsTheArrayAndTheRerunContinues) {
  write_sweep(kTwoRuns);
  const fs::path started = dir_ / "started";
  // --parallel=1 (the array's %1): lr=0.1 has ended before lr=0.3 starts and blocks.
  const pid_t pid =
      start_in_background(command("FAKE_BLOCK_LR=0.3 FAKE_STARTED='" + started.string() + "'",
                                  "--launcher=slurm --parallel=1"));
  ASSERT_GE(pid, 0);
  const std::string blocked = wait_for_line(started);
  ASSERT_FALSE(blocked.empty()) << read(dir_ / "first.out");
  kill(pid, SIGINT);
  const auto stopped = wait_for_exit(pid, std::chrono::seconds(120));
  ASSERT_TRUE(stopped) << "the sweep did not stop on SIGINT:\n" << read(dir_ / "first.out");
  const int status = *stopped;
  const std::string first = read(dir_ / "first.out");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << first;
  EXPECT_NE(first.find("scancel"), std::string::npos) << first;
  EXPECT_TRUE(gone(std::stoi(blocked))) << "the cancelled run must be gone";
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=1"]["status"], "interrupted") << first;
  EXPECT_EQ(state()["runs"]["lr=0.1_seed=1"]["status"], "done") << first;
  EXPECT_NE(read(dir_ / "out" / "slurm" / "array.sh").find("#SBATCH --array=0-1%1\n"),
            std::string::npos);

  const auto r = sweep("", "--launcher=slurm");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("2 done, 0 failed, 0 not run"), std::string::npos) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 3u) << r.out;
  EXPECT_EQ(calls[2], "0.3 1");
}

}  // namespace
