// Jobs that heal (fabric.max_restarts, fabric/distributed/restart_agent.h), with real processes:
//   - a 2-rank DDP job (shared memory on CPU) whose ranks are SIGKILLed from outside at random
//     moments, three times, finishes with the state of an uninterrupted run, bitwise;
//   - a frozen rank (SIGSTOP) is found by the heartbeat and the job restarts and finishes bitwise;
//   - a job that fails in every attempt stops after max_restarts restarts, naming the cause, and
//     each attempt that found no checkpoint of the job starts as the first did;
//   - a rank that fails because the loss diverged (exit 3) is a result: no restart;
//   - under torchrun --max-restarts a restarted attempt resumes from the job's newest checkpoint
//     by itself and finishes bitwise like the uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fabric/checkpointer.h"
#include "tests/checkpoint_diff.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The value of `name` in process `pid`'s environment ("" when absent or unreadable).
std::string environment_of(pid_t pid, const std::string& name) {
  const std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = name + "=";
  for (size_t at = 0; at < env.size();) {
    const size_t end = env.find('\0', at);
    const std::string var = env.substr(at, end - at);
    if (var.rfind(key, 0) == 0) return var.substr(key.size());
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return "";
}

// The child of `parent` whose `rank_var` is `rank` and `attempt_var` is `attempt`.
std::optional<pid_t> rank_process(pid_t parent, int rank, int attempt,
                                  const std::string& rank_var = "FABRIC_LOCAL_RANK",
                                  const std::string& attempt_var = "FABRIC_RESTART_COUNT") {
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(stat.c_str() + paren + 2, "%c %d", &state, &ppid) != 2) continue;
    if (ppid != parent || state == 'Z') continue;
    const pid_t pid = std::stoi(name);
    if (environment_of(pid, rank_var) == std::to_string(rank) &&
        environment_of(pid, attempt_var) == std::to_string(attempt))
      return pid;
  }
  return std::nullopt;
}

// The highest step of a checkpoint file under `root` (-1: none yet).
int64_t newest_step(const fs::path& root) {
  int64_t newest = -1;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
    newest = std::max(newest, fabric::checkpoint_step(it->path().filename().string()));
  return newest;
}

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "restart_XXXXXX").string();
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `env`: "NAME=VALUE ..." for the job.
  std::string command(const std::string& args, const std::string& env = "") const {
    return "cd '" + dir_.string() + "' && " + env + " exec '" +
           fabric::testing::helper_binary("//tests/integration:resume_helper") +
           "' fabric.accelerator=cpu fabric.devices=2 fabric.ddp.timeout_s=60 "
           "optimizer.name=adamw optimizer.lr=0.01 scheduler.name=cosine trainer.max_steps=24 "
           "data.batch_size=4 data.num_workers=0 checkpoint.export_weights=none "
           "checkpoint.every_n_epochs=0 fabric.restart_backoff_s=0 " +
           args;
  }

  // Starts `args` in the background, its output in `log`; returns the pid (the job's agent).
  pid_t start(const std::string& args, const fs::path& log) const {
    return start_shell(command(args), log);
  }
  // Starts the shell command `line` (ending in an exec) in the background.
  pid_t start_shell(const std::string& line, const fs::path& log) const {
    const std::string sh = line + " > '" + log.string() + "' 2>&1";
    const pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", sh.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }

  // The job (the agent `agent`, its checkpoints under `runs`) once a checkpoint of step >= `step`
  // exists and rank `rank` of attempt `attempt` runs: that rank's pid (nullopt if the job ended or
  // 120 s passed). `rank_var`/`attempt_var`: the variables naming them (the self-launcher's, or
  // torchrun's RANK and TORCHELASTIC_RESTART_COUNT).
  std::optional<pid_t> rank_at_step(pid_t agent, const std::string& runs, int64_t step, int rank,
                                    int attempt, const std::string& rank_var = "FABRIC_LOCAL_RANK",
                                    const std::string& attempt_var = "FABRIC_RESTART_COUNT") {
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    while (Clock::now() < deadline && waitpid(agent, nullptr, WNOHANG) == 0) {
      if (newest_step(dir_ / runs) >= step)
        if (auto pid = rank_process(agent, rank, attempt, rank_var, attempt_var)) return pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // polling, not timing
    }
    return std::nullopt;
  }

  // Waits for the job; its exit status (as a shell reports it) and output.
  fabric::testing::CommandResult finish(pid_t agent, const fs::path& log) {
    int status = 0;
    fabric::testing::CommandResult r;
    if (waitpid(agent, &status, 0) == agent)
      r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(log);
    return r;
  }

  // The uninterrupted run every healed one must equal: reference.ckpt.
  fabric::testing::CommandResult run_reference(const std::string& job) {
    return fabric::testing::run_command(
        command(job + "logging.run_dir=reference/{timestamp} test.out=reference.ckpt"));
  }

  fs::path dir_;
};

TEST_F(RestartTest, RanksKilledAtRandomMomentsRestartAndFinishBitwiseLikeAnUninterruptedRun) {
  // 1M extra parameters (~12 MB checkpoints with AdamW's state) so that a run lasts long enough
  // for the kills to land inside it; a checkpoint every 2 of 24 steps.
  const std::string job = "test.extra_params=1000000 checkpoint.every_n_steps=2 ";
  auto reference = run_reference(job);
  ASSERT_EQ(reference.code, 0) << reference.out;

  const fs::path log = dir_ / "healed.log";
  const pid_t agent = start(
      job + "fabric.max_restarts=3 logging.run_dir=healed/{timestamp} " + "test.out=healed.ckpt",
      log);
  ASSERT_GT(agent, 0);
  std::mt19937 gen(20261125);
  std::uniform_int_distribution<int> pick_rank(0, 1);
  // Attempt k is killed once a checkpoint of step >= targets[k] exists (somewhere between 2 and
  // 5 steps into the attempt's own progress, wherever its processes are by then).
  const std::vector<int64_t> targets = {4, 8, 14};
  std::string kills;
  for (int attempt = 0; attempt < static_cast<int>(targets.size()); ++attempt) {
    const int rank = pick_rank(gen);
    const auto victim = rank_at_step(agent, "healed", targets[attempt], rank, attempt);
    ASSERT_TRUE(victim) << "attempt " << attempt << " never reached step " << targets[attempt]
                        << "\n"
                        << read_file(log);
    ASSERT_EQ(kill(*victim, SIGKILL), 0);
    kills += " attempt " + std::to_string(attempt) + ": rank " + std::to_string(rank) + ";";
  }
  const auto [code, out] = finish(agent, log);
  ASSERT_EQ(code, 0) << kills << "\n" << out;
  for (int k = 1; k <= 3; ++k) {
    EXPECT_NE(out.find("fabric: restart " + std::to_string(k) +
                       " of 3 in 0.0 s "
                       "(fabric.max_restarts): rank "),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("restart " + std::to_string(k) + ": resumed from "), std::string::npos)
        << out;
  }
  EXPECT_NE(out.find("was killed by signal 9 (Killed) after step "), std::string::npos) << out;
  EXPECT_NE(out.find("steps to redo)"), std::string::npos) << out;
  EXPECT_EQ(out.find("restart 4"), std::string::npos) << out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "reference.ckpt", dir_ / "healed.ckpt"), "")
      << kills << "\n"
      << out;
  std::cout << "killed:" << kills << std::endl;
}

TEST_F(RestartTest, AFrozenRankIsFoundByTheHeartbeatAndTheJobRestarts) {
  const std::string job = "test.extra_params=1000000 checkpoint.every_n_steps=2 ";
  auto reference = run_reference(job);
  ASSERT_EQ(reference.code, 0) << reference.out;
  const fs::path log = dir_ / "frozen.log";
  const pid_t agent = start(job +
                                "fabric.max_restarts=1 fabric.ddp.heartbeat_timeout_s=2 "
                                "logging.run_dir=frozen/{timestamp} test.out=frozen.ckpt",
                            log);
  ASSERT_GT(agent, 0);
  const auto victim = rank_at_step(agent, "frozen", 6, 1, 0);
  ASSERT_TRUE(victim) << read_file(log);
  ASSERT_EQ(kill(*victim, SIGSTOP), 0);  // alive, sockets open, silent
  const auto [code, out] = finish(agent, log);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("rank 1 stopped sending heartbeats"), std::string::npos) << out;
  EXPECT_NE(out.find("fabric: restart 1 of 1 in 0.0 s (fabric.max_restarts): rank 0 exited with "
                     "code 1"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("restart 1: resumed from "), std::string::npos) << out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "reference.ckpt", dir_ / "frozen.ckpt"), "")
      << out;
}

TEST_F(RestartTest, ExhaustedRestartsEndTheJobNamingTheCause) {
  // Every attempt kills itself while writing its first checkpoint (fault injection,
  // fabric/core/atomic_file.h): no attempt ever has a checkpoint of the job to resume from.
  const auto r = fabric::testing::run_command(
      command("test.extra_params=1000000 checkpoint.every_n_steps=2 fabric.max_restarts=2 "
              "logging.run_dir=runs/{timestamp}",
              "FABRIC_TEST_KILL_AFTER_BYTES=100000"));
  EXPECT_EQ(r.code, 128 + SIGKILL) << r.out;
  EXPECT_NE(r.out.find("fabric: restart 1 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fabric: restart 2 of 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fabric: giving up after 2 restarts (fabric.max_restarts: 2): rank 0 was "
                       "killed by signal 9 (Killed)"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("restart 2: no complete checkpoint of this job yet; starting as its first "
                       "attempt did (checkpoint.resume: none)"),
            std::string::npos)
      << r.out;
}

TEST_F(RestartTest, ADivergedRunIsAResultAndIsNotRestarted) {
  const auto r = fabric::testing::run_command(
      command("optimizer.name=sgd optimizer.lr=1e30 trainer.stop_on_nonfinite=2 "
              "fabric.max_restarts=2 logging.run_dir=runs/{timestamp}"));
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("fabric: not restarting: rank 0 exited with code 3 (training stopped on "
                       "non-finite losses: a result, not a failure)"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("fabric: restart 1"), std::string::npos) << r.out;
}

// torchrun restarts every worker itself (--max-restarts); the workers see
// TORCHELASTIC_RESTART_COUNT = 1 and resume from the newest checkpoint written since torchrun's
// agent (their parent) started.
TEST_F(RestartTest, UnderTorchrunARestartedAttemptResumesFromTheJobsNewestCheckpoint) {
  const std::string python = fabric::testing::python_interpreter();
  const auto probe = fabric::testing::run_command(python + " -c 'import torch.distributed.run'");
  if (probe.code != 0)
    GTEST_SKIP() << "no torch.distributed.run for " << python << " (tools/setup.sh installs torch)";
  const std::string job = "test.extra_params=1000000 checkpoint.every_n_steps=2 ";
  auto reference = run_reference(job);
  ASSERT_EQ(reference.code, 0) << reference.out;
  // command() ends in "exec 'BINARY' ARGS": torchrun takes the binary's place.
  std::string line = command(job + "logging.run_dir=healed/{timestamp} test.out=healed.ckpt");
  line.replace(line.find("exec '"), 6,
               "exec " + python +
                   " -m torch.distributed.run --standalone --nproc-per-node=2 "
                   "--max-restarts=1 --no-python '");
  const fs::path log = dir_ / "torchrun.log";
  const pid_t agent = start_shell(line, log);
  ASSERT_GT(agent, 0);
  const auto victim = rank_at_step(agent, "healed", 6, 1, 0, "RANK", "TORCHELASTIC_RESTART_COUNT");
  ASSERT_TRUE(victim) << read_file(log);
  ASSERT_EQ(kill(*victim, SIGKILL), 0);
  const auto [code, out] = finish(agent, log);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NE(out.find("restart 1: resumed from "), std::string::npos) << out;
  EXPECT_EQ(fabric::testing::compare_checkpoints(dir_ / "reference.ckpt", dir_ / "healed.ckpt"), "")
      << out;
}

}  // namespace
