// Fail-fast under an external launcher (issue 7): a rank that freezes (SIGSTOP: its connections
// stay open, so the collective itself would wait for fabric.ddp.timeout_s = 120 s) ends the other
// ranks within 10 s with an error naming it; so does the rank hosting the store. Real processes
// over loopback; deadlines are polled, never slept on for a result.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/run_command.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

class HeartbeatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "hb_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    for (pid_t pid : pids_) {
      if (pid <= 0) continue;  // reaped already (kill(-1, ...) would signal every process)
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    fs::remove_all(dir_);
  }

  // Starts rank `rank` of 2; its output goes to rank<R>.out.
  void start(int rank, int port) {
    const std::string exe = fabric::testing::helper_binary("//tests/integration:heartbeat_helper");
    const std::string out = (dir_ / ("rank" + std::to_string(rank) + ".out")).string();
    const pid_t pid = fork();
    if (pid == 0) {
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", "2", 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      const int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execl(exe.c_str(), exe.c_str(), "fabric.accelerator=cpu", "fabric.strategy=ddp",
            "fabric.ddp.timeout_s=120", "fabric.ddp.heartbeat_timeout_s=3", nullptr);
      _exit(127);
    }
    pids_.push_back(pid);
  }
  std::string output(int rank) { return read(dir_ / ("rank" + std::to_string(rank) + ".out")); }

  // Both ranks printed "ready" (bounded wait).
  bool ready() {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      if (output(0).find("rank 0 ready") != std::string::npos &&
          output(1).find("rank 1 ready") != std::string::npos)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // Seconds until `rank` exits (its status in *status), or -1 after 30 s.
  double seconds_until_exit(int rank, int* status) {
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::seconds(30)) {
      if (waitpid(pids_[static_cast<size_t>(rank)], status, WNOHANG) > 0) {
        pids_[static_cast<size_t>(rank)] = -1;
        return std::chrono::duration<double>(Clock::now() - t0).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  fs::path dir_;
  std::vector<pid_t> pids_;
};

TEST_F(HeartbeatTest, AFrozenRankEndsTheOthersNamingIt) {
  const int port = fabric::testing::free_loopback_port();
  start(0, port);
  start(1, port);
  ASSERT_TRUE(ready()) << output(0) << output(1);
  kill(pids_[1], SIGSTOP);
  int status = 0;
  const double s = seconds_until_exit(0, &status);
  ASSERT_GE(s, 0) << "rank 0 still runs 30 s after rank 1 froze:\n" << output(0);
  EXPECT_LT(s, 10.0) << output(0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(output(0).find("error (rank 0): rank 1 "), std::string::npos) << output(0);
  EXPECT_NE(output(0).find("(killed, crashed or frozen); stopping this rank"), std::string::npos)
      << output(0);
  std::printf("rank 1 frozen -> rank 0 exited after %.2f s\n", s);
}

TEST_F(HeartbeatTest, AFrozenStoreHostEndsTheOthersNamingIt) {
  const int port = fabric::testing::free_loopback_port();
  start(0, port);
  start(1, port);
  ASSERT_TRUE(ready()) << output(0) << output(1);
  kill(pids_[0], SIGSTOP);
  int status = 0;
  const double s = seconds_until_exit(1, &status);
  ASSERT_GE(s, 0) << "rank 1 still runs 30 s after rank 0 froze:\n" << output(1);
  EXPECT_LT(s, 10.0) << output(1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(
      output(1).find("error (rank 1): rank 0 (host of the rendezvous store) has not answered"),
      std::string::npos)
      << output(1);
  std::printf("rank 0 frozen -> rank 1 exited after %.2f s\n", s);
}

}  // namespace
