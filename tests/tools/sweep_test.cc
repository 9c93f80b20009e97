// //tools:sweep end to end with tests/tools/fake_trainer (a real Fabric command line that trains
// nothing): results, failures that do not stop the sweep, re-runs that only run what is left,
// Ctrl-C, up-front checks of every run's config, the sweep directory lock; the same as a SLURM job
// array on a one-machine cluster (tools/slurm_local.sh).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "tests/run_command.h"
#include "tests/slurm_cluster.h"

namespace fs = std::filesystem;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

double fake_metric(double lr, int seed) { return 1 - 10 * (lr - 0.2) * (lr - 0.2) + 0.001 * seed; }

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "sweep_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    fake_ = (fs::current_path() / "tests" / "fake_trainer").string();
    sweep_ = (fs::current_path() / "tools" / "sweep").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A sweep file with `body` after the binary line.
  fs::path write_sweep(const std::string& body) {
    const fs::path file = dir_ / "s.yaml";
    std::ofstream(file) << "binary: " << fake_ << "\n" << body;
    return file;
  }
  std::string command(const std::string& env, const std::string& flags = "",
                      const std::string& dir = "out") {
    return "cd '" + dir_.string() + "' && FAKE_INVOCATIONS='" + (dir_ / "invocations").string() +
           "' " + env + " exec '" + sweep_ + "' --sweep=s.yaml --dir=" + dir + " " + flags;
  }
  fabric::testing::CommandResult sweep(const std::string& env = "", const std::string& flags = "") {
    return fabric::testing::run_command(command(env, flags));
  }
  std::vector<std::string> invocations() { return lines(read(dir_ / "invocations")); }
  nlohmann::json state() { return nlohmann::json::parse(read(dir_ / "out" / "sweep_state.json")); }

  fs::path dir_;
  std::string fake_, sweep_;
};

constexpr const char* kLrSeeds =
    "grid:\n  optimizer.lr: [0.1, 0.2, 0.3]\nseeds: [1, 2]\nmetric: fake_metric\nmode: max\n";

TEST_F(SweepTest, RunsEveryPointWritesResultsAndRerunRetriesOnlyTheFailedRuns) {
  write_sweep(kLrSeeds);
  auto r = sweep("FAKE_FAIL_LR=0.3");
  EXPECT_EQ(r.code, 1) << r.out;  // a failing run does not stop the sweep
  EXPECT_EQ(invocations().size(), 6u) << r.out;
  EXPECT_NE(r.out.find("FAILED lr=0.3_seed=1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("error: fake failure at lr 0.300000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4 done, 2 failed, 0 not run"), std::string::npos) << r.out;

  // results.csv: one row per run, metrics from each run's summary.json.
  auto csv = lines(read(dir_ / "out" / "results.csv"));
  ASSERT_EQ(csv.size(), 7u) << read(dir_ / "out" / "results.csv");
  EXPECT_EQ(csv[0].rfind("run,status,exit_code,attempts,optimizer.lr,seed,fake_metric,steps,", 0),
            0u)
      << csv[0];
  int failed = 0;
  for (size_t i = 1; i < csv.size(); ++i) {
    std::istringstream row(csv[i]);
    std::vector<std::string> c;
    for (std::string cell; std::getline(row, cell, ',');) c.push_back(cell);
    ASSERT_GE(c.size(), 7u) << csv[i];
    const double lr = std::stod(c[4]);
    const int seed = std::stoi(c[5]);
    if (c[1] == "failed") {
      ++failed;
      EXPECT_EQ(lr, 0.3);
      EXPECT_EQ(c[2], "1");
      EXPECT_EQ(c[6], "");
    } else {
      EXPECT_EQ(c[1], "done") << csv[i];
      EXPECT_NEAR(std::stod(c[6]), fake_metric(lr, seed), 1e-9) << csv[i];
    }
  }
  EXPECT_EQ(failed, 2);

  // The table: best first, mean ± sample std over the seeds; the failed point last.
  const std::string md = read(dir_ / "out" / "results.md");
  const auto rows = lines(md);
  ASSERT_GE(rows.size(), 7u) << md;
  char best[128];
  const double m1 = fake_metric(0.2, 1), m2 = fake_metric(0.2, 2);
  std::snprintf(best, sizeof(best), "| 1 | 0.2 | %.4f ± %.4f | 2/2 |", (m1 + m2) / 2,
                std::sqrt(((m1 - m2) * (m1 - m2)) / 2));
  EXPECT_EQ(rows[4].rfind(best, 0), 0u) << md;
  EXPECT_EQ(rows[5].rfind("| 2 | 0.1 |", 0), 0u) << md;
  EXPECT_EQ(rows[6].rfind("| – | 0.3 | – | 0/2 |", 0), 0u) << md;
  EXPECT_NE(r.out.find(rows[4]), std::string::npos) << "table is printed too";

  // Re-run: only the two failed runs run again, and now succeed.
  r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 8u) << r.out;
  EXPECT_EQ(calls[6], "0.3 1");
  EXPECT_EQ(calls[7], "0.3 2");
  EXPECT_EQ(state()["runs"]["lr=0.3_seed=2"]["attempts"], 2);
  EXPECT_NE(r.out.find("6 done, 0 failed, 0 not run"), std::string::npos) << r.out;

  // Once everything is done, nothing runs.
  r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 8u) << r.out;
}

TEST_F(SweepTest, InterruptStopsTheRunningRunAndTheRerunContinuesWithTheRest) {
  write_sweep(kLrSeeds);
  const fs::path started = dir_ / "started";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string cmd = command("FAKE_BLOCK_LR=0.3 FAKE_STARTED='" + started.string() + "'");
    execl("/bin/sh", "sh", "-c",
          ("exec >'" + (dir_ / "first.out").string() + "' 2>&1; " + cmd).c_str(), nullptr);
    _exit(127);
  }
  // Wait (bounded) until the third run is blocked, then press "Ctrl-C".
  std::string blocked;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    blocked = read(started);
    if (!blocked.empty() && blocked.back() == '\n') break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(blocked.empty()) << read(dir_ / "first.out");
  kill(pid, SIGINT);
  int status = 0;
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > stop_deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "the sweep did not stop on SIGINT:\n" << read(dir_ / "first.out");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGINT) << read(dir_ / "first.out");
  const pid_t run_pid = std::stoi(blocked);
  EXPECT_EQ(kill(run_pid, 0), -1) << "the interrupted run must be gone";
  auto s = state();
  EXPECT_EQ(s["runs"]["lr=0.1_seed=1"]["status"], "done");
  EXPECT_EQ(s["runs"]["lr=0.3_seed=1"]["status"], "interrupted");
  EXPECT_EQ(s["runs"]["lr=0.1_seed=2"]["status"], "pending");
  EXPECT_NE(read(dir_ / "first.out").find("4 not run"), std::string::npos)
      << read(dir_ / "first.out");

  const auto r = sweep();
  EXPECT_EQ(r.code, 0) << r.out;
  const auto calls = invocations();
  ASSERT_EQ(calls.size(), 7u) << r.out;  // 3 before the interrupt, then the 4 left
  EXPECT_EQ(calls[3], "0.3 1");
  EXPECT_EQ(calls[4], "0.1 2");
}

TEST_F(SweepTest, EveryRunIsCheckedBeforeAnyRuns) {
  write_sweep("grid:\n  optimizer.lr: [0.1, -1]\nmetric: fake_metric\nmode: max\n");
  auto r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:3:23: optimizer.lr: -1 is out of range: must be > 0.0 (run lr=-1)"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "invocations")) << "nothing may run";

  write_sweep("grid:\n  optimizer.lrr: [0.1]\nmetric: fake_metric\nmode: max\n");
  r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:3:3: 'optimizer.lrr' is not a key of"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("did you mean 'optimizer.lr'?"), std::string::npos) << r.out;

  write_sweep("grid:\n  optimizer.lr: [0.1]\nmetric: fake_metric\nmode: maximum\n");
  r = sweep();
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("s.yaml:5:7: mode: 'maximum' is not max or min"), std::string::npos)
      << r.out;
}

TEST_F(SweepTest, ASecondSweepOnTheSameDirectoryIsRefused) {
  write_sweep(kLrSeeds);
  fs::create_directories(dir_ / "out");
  const int fd = open((dir_ / "out" / ".lock").c_str(), O_RDWR | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(flock(fd, LOCK_EX), 0);
  const auto r = sweep();
  close(fd);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("another sweep is running in"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "invocations"));
}

TEST_F(SweepTest, MaxRunsStartsOnlyThatMany) {
  write_sweep(kLrSeeds);
  auto r = sweep("", "--max_runs=2 --parallel=2");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 2u) << r.out;
  EXPECT_NE(r.out.find("2 done, 0 failed, 4 not run"), std::string::npos) << r.out;
  r = sweep("", "--parallel=3");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(invocations().size(), 6u) << r.out;
}

// The real example program by label (a data dependency of //tools:sweep), a few steps per run.
TEST_F(SweepTest, RunsTheFashionMnistExampleByLabel) {
  std::ofstream(dir_ / "s.yaml")
      << "binary: //examples:fashion_mnist\nconfig: fashion_mnist.yaml\n"
         "overrides: {trainer.max_steps: 3, trainer.limit_eval_batches: 2, model.width: 4, "
         "model.hidden: 8}\n"
         "grid:\n  optimizer.lr: [0.05, 0.1]\nmetric: test_accuracy\nmode: max\n";
  const auto r =
      fabric::testing::run_command("cd '" + dir_.string() + "' && BUILD_WORKING_DIRECTORY='" +
                                   dir_.string() + "' '" + sweep_ + "' --sweep=s.yaml --dir=out");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto csv = lines(read(dir_ / "out" / "results.csv"));
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(csv[0].rfind("run,status,exit_code,attempts,optimizer.lr,seed,test_accuracy,", 0), 0u)
      << csv[0];
  for (const char* id : {"lr=0.05", "lr=0.1"}) {
    const fs::path run = dir_ / "out" / "runs" / id;
    EXPECT_TRUE(fs::exists(run / "summary.json")) << id;
    EXPECT_TRUE(fs::exists(run / "metrics.csv")) << id;
    const auto summary = nlohmann::json::parse(read(run / "summary.json"));
    EXPECT_EQ(summary["steps"], 3);
  }
}

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
  // The contents of `file` once it ends with a newline (bounded wait: 120 s).
  std::string wait_for_line(const fs::path& file) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::string text;
    while (std::chrono::steady_clock::now() < deadline) {
      text = read(file);
      if (!text.empty() && text.back() == '\n') break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return text;
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

// Cells 0, 1, 2, 4, 5, 6 of each results.csv row (run, status, exit code, lr, seed, metric): all but
// the attempts and what follows the metric.
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
  EXPECT_NE(r.out.find("still queued or running in SLURM (job " + job.substr(0, job.find('_')) +
                       ")"),
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
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // --parallel=1 (the array's %1): lr=0.1 has ended before lr=0.3 starts and blocks.
    const std::string cmd = command("FAKE_BLOCK_LR=0.3 FAKE_STARTED='" + started.string() + "'",
                                    "--launcher=slurm --parallel=1");
    execl("/bin/sh", "sh", "-c",
          ("exec >'" + (dir_ / "first.out").string() + "' 2>&1; " + cmd).c_str(), nullptr);
    _exit(127);
  }
  const std::string blocked = wait_for_line(started);
  ASSERT_FALSE(blocked.empty()) << read(dir_ / "first.out");
  kill(pid, SIGINT);
  int status = 0;
  const auto stop_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > stop_deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      FAIL() << "the sweep did not stop on SIGINT:\n" << read(dir_ / "first.out");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
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
