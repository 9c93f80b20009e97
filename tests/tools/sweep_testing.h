// The fixture of //tools:sweep's tests (sweep_test: local runs; sweep_slurm_test: SLURM job
// arrays): a temporary folder with a sweep file for tests/tools/fake_trainer, the sweep's command
// line, its state and the fake trainer's invocation log.
#ifndef TESTS_TOOLS_SWEEP_TESTING_H_
#define TESTS_TOOLS_SWEEP_TESTING_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/run_command.h"

namespace fabric::testing {

namespace fs = std::filesystem;

inline std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

inline double fake_metric(double lr, int seed) {
  return 1 - 10 * (lr - 0.2) * (lr - 0.2) + 0.001 * seed;
}

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "sweep_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
    fake_ = fabric::testing::helper_binary("//tests/tools:fake_trainer");
    sweep_ = (fs::current_path() / "tools" / "sweep" / "sweep").string();
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

  // Starts `command` through /bin/sh in a child process, output to <dir>/first.out.
  pid_t start_in_background(const std::string& command) {
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c",
            ("exec >'" + (dir_ / "first.out").string() + "' 2>&1; " + command).c_str(), nullptr);
      _exit(127);
    }
    return pid;
  }
  // Starts the sweep in the background with the run of lr `lr` blocking once started; returns
  // the sweep's pid and, once that run has started (bounded wait), its pid (0 when it did not).
  std::pair<pid_t, pid_t> start_with_blocked_run(const std::string& lr) {
    const fs::path started = dir_ / "started";
    const pid_t pid = start_in_background(
        command("FAKE_BLOCK_LR=" + lr + " FAKE_STARTED='" + started.string() + "'"));
    const std::string blocked = pid > 0 ? wait_for_line(started) : "";
    return {pid, blocked.empty() ? 0 : std::stoi(blocked)};
  }
  // The contents of `file` once it ends with a newline ("" after 120 s).
  static std::string wait_for_line(const fs::path& file) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    std::string text;
    while (std::chrono::steady_clock::now() < deadline) {
      text = read(file);
      if (!text.empty() && text.back() == '\n') return text;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return "";
  }
  // The wait status of `pid` once it ends; nullopt (and the child killed) after `limit`.
  static std::optional<int> wait_for_exit(pid_t pid, std::chrono::seconds limit) {
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return std::nullopt;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status;
  }
  nlohmann::json state() { return nlohmann::json::parse(read(dir_ / "out" / "sweep_state.json")); }

  fs::path dir_;
  std::string fake_, sweep_;
};

}  // namespace fabric::testing

#endif  // TESTS_TOOLS_SWEEP_TESTING_H_
