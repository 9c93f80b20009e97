// Self-launch supervision with real processes (tests/integration/launch_helper.cc): fail-fast on
// a failing rank, no orphans when the parent is killed, Ctrl-C teardown, concurrent jobs. The
// deadlines are the promises ("gone within 10 s"), polled, never slept on for a result.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "tests/run_command.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

extern char** environ;

namespace {

constexpr auto kDeadline = std::chrono::seconds(10);

// True when `pid` no longer runs (no such process, or a zombie waiting to be reaped).
bool gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

template <typename Pred>
bool eventually(Pred pred, std::chrono::seconds limit = kDeadline) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "launch_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    for (pid_t pid : all_pids_)
      if (!gone(pid)) kill(pid, SIGKILL);
    fs::remove_all(dir_);
  }

  struct Job {
    pid_t pid;
    fs::path pids, log;
  };

  // Starts a job in its own process group (as a shell would), stderr to a log file.
  Job start(int world, const std::string& behaviour) {
    Job job;
    job.pids = dir_ / ("job" + std::to_string(jobs_));
    job.log = dir_ / ("job" + std::to_string(jobs_++) + ".log");
    fs::create_directories(job.pids);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 2, job.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    std::string exe = fabric::testing::helper_binary("//tests/integration:launch_helper");
    std::string w = std::to_string(world), dir = job.pids.string();
    std::vector<char*> argv = {exe.data(), w.data(), const_cast<char*>(behaviour.c_str()),
                               dir.data(), nullptr};
    EXPECT_EQ(posix_spawn(&job.pid, exe.c_str(), &actions, &attr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    all_pids_.push_back(job.pid);
    return job;
  }

  // The pids of all `world` ranks, once each has written its file.
  std::vector<pid_t> pids_of(const Job& job, int world) {
    std::vector<pid_t> pids;
    EXPECT_TRUE(eventually([&] {
      for (int r = 0; r < world; ++r)
        if (!fs::exists(job.pids / ("rank_" + std::to_string(r) + ".pid"))) return false;
      return true;
    })) << "not every rank started";
    for (int r = 0; r < world; ++r) {
      pid_t pid = 0;
      std::ifstream(job.pids / ("rank_" + std::to_string(r) + ".pid")) >> pid;
      pids.push_back(pid);
      all_pids_.push_back(pid);
    }
    return pids;
  }

  // Exit status (waitpid encoding) of the job's rank 0, or -1 if it is still running at the
  // deadline.
  int wait_exit(const Job& job) {
    int status = -1;
    eventually([&] { return waitpid(job.pid, &status, WNOHANG) == job.pid; });
    return status;
  }

  std::string log_of(const Job& job) {
    std::ifstream in(job.log);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

  fs::path dir_;
  int jobs_ = 0;
  std::vector<pid_t> all_pids_;
};

TEST_F(LauncherTest, HealthyJobExitsZero) {
  Job job = start(3, "ok");
  const int status = wait_exit(job);
  ASSERT_TRUE(WIFEXITED(status)) << log_of(job);
  EXPECT_EQ(WEXITSTATUS(status), 0) << log_of(job);
  for (pid_t pid : pids_of(job, 3)) EXPECT_TRUE(eventually([&] { return gone(pid); }));
}

TEST_F(LauncherTest, FailingRankStopsEveryProcessAndNamesTheRank) {
  Job job = start(3, "fail");
  const std::vector<pid_t> pids = pids_of(job, 3);
  const int status = wait_exit(job);
  ASSERT_TRUE(WIFEXITED(status)) << "job still running after 10 s: " << log_of(job);
  EXPECT_EQ(WEXITSTATUS(status), 3);
  EXPECT_NE(log_of(job).find("fabric: rank 1 exited with code 3; stopping the job"),
            std::string::npos)
      << log_of(job);
  for (pid_t pid : pids)
    EXPECT_TRUE(eventually([&] { return gone(pid); })) << "pid " << pid << " survived";
}

TEST_F(LauncherTest, KillingTheParentLeavesNoOrphans) {
  Job job = start(3, "hang");
  const std::vector<pid_t> pids = pids_of(job, 3);
  ASSERT_EQ(kill(job.pid, SIGKILL), 0);
  const int status = wait_exit(job);
  EXPECT_TRUE(WIFSIGNALED(status));
  for (size_t r = 1; r < pids.size(); ++r)
    EXPECT_TRUE(eventually([&] { return gone(pids[r]); }))
        << "rank " << r << " outlived its parent";
}

TEST_F(LauncherTest, CtrlCTearsDownTheWholeJob) {
  Job job = start(3, "hang");
  const std::vector<pid_t> pids = pids_of(job, 3);
  ASSERT_EQ(kill(-job.pid, SIGINT), 0);  // what the terminal does: the whole foreground group
  const int status = wait_exit(job);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGINT) << status;
  for (pid_t pid : pids) EXPECT_TRUE(eventually([&] { return gone(pid); }));
}

TEST_F(LauncherTest, ThreeJobsSideBySide) {
  std::vector<Job> jobs = {start(2, "ok"), start(2, "ok"), start(2, "ok")};
  for (auto& job : jobs) {
    const int status = wait_exit(job);
    ASSERT_TRUE(WIFEXITED(status)) << log_of(job);
    EXPECT_EQ(WEXITSTATUS(status), 0) << log_of(job);
  }
}

}  // namespace
