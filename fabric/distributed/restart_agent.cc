#include "fabric/distributed/restart_agent.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/launchers/job_progress.h"
#include "fabric/launchers/subprocess_launcher.h"

namespace fabric {
namespace {

std::atomic<int> g_signal{0};
std::atomic<int> g_pipe_write{-1};

extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);
  const int fd = g_pipe_write.load();
  const char byte = 1;
  if (fd >= 0 && write(fd, &byte, 1) < 0) {
    // Nothing to do in a signal handler; g_signal is set.
  }
}

// SIGINT and SIGTERM while the agent runs: a flag and a byte in a pipe the launcher watches.
class StopSignals {
 public:
  StopSignals() {
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("restart agent: pipe: ") + std::strerror(errno));
    g_signal = 0;
    g_pipe_write = fds_[1];
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    g_pipe_write = -1;
    close(fds_[0]);
    close(fds_[1]);
  }
  int read_fd() const { return fds_[0]; }
  int signal() const { return g_signal.load(); }
  // Waits `duration` unless a stop signal comes first; returns whether one came.
  bool wait_for(std::chrono::milliseconds duration) const {
    const auto deadline = std::chrono::steady_clock::now() + duration;
    while (signal() == 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd fd = {fds_[0], POLLIN, 0};
      poll(&fd, 1, static_cast<int>(left.count()));
    }
    return true;
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

void say(const std::string& line) {
  std::fprintf(stderr, "fabric: %s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace

int run_restart_agent(const RestartAgentOptions& o) {
  distributed::StoreOptions store_options;
  store_options.is_server = true;
  store_options.world_size = o.world_size;
  store_options.timeout = o.store_timeout;
  const auto store = distributed::make_store(store_options);
  const int port = distributed::store_port(store);
  JobProgress progress(o.world_size);
  const auto started = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  StopSignals stop;
  int64_t failed_step = -1;
  for (int64_t attempt = 0;; ++attempt) {
    LaunchOptions launch;
    launch.world_size = o.world_size;
    launch.master_port = port;
    launch.grace = o.grace;
    launch.first_rank = 0;
    launch.fail_fast = false;
    launch.interrupt_fd = stop.read_fd();
    launch.env = {"FABRIC_AGENT_STORE=1", "FABRIC_RESTART_COUNT=" + std::to_string(attempt),
                  "FABRIC_JOB_START_NS=" + std::to_string(started),
                  "FABRIC_FAILED_STEP=" + std::to_string(failed_step),
                  "FABRIC_PROGRESS_FD=" + std::to_string(progress.fd())};
    progress.reset();
    int code = 0;
    std::optional<ChildExit> failure;
    {
      SubprocessLauncher ranks(launch, o.argv);
      code = ranks.wait();
      failure = ranks.failure();
    }
    if (stop.signal() != 0) return 128 + stop.signal();
    if (code == 0) return 0;
    const std::string what = failure ? failure->describe() : "a rank failed";
    const int64_t reached = progress.furthest_step();
    const std::string where = reached >= 0 ? " after step " + std::to_string(reached) : "";
    if (failure && failure->signal == SIGINT) return code;  // Ctrl-C reached the ranks first
    if (code == 2 || code == 3) {
      say("not restarting: " + what +
          (code == 2 ? " (a configuration error would repeat)"
                     : " (training stopped on non-finite losses: a result, not a failure)"));
      return code;
    }
    if (attempt >= o.max_restarts) {
      say("giving up after " + std::to_string(attempt) + " restart" + (attempt == 1 ? "" : "s") +
          " (fabric.max_restarts: " + std::to_string(o.max_restarts) + "): " + what + where);
      return code;
    }
    char backoff[32];
    std::snprintf(backoff, sizeof(backoff), "%.1f s",
                  std::chrono::duration<double>(o.backoff).count());
    say("restart " + std::to_string(attempt + 1) + " of " + std::to_string(o.max_restarts) +
        " in " + backoff + " (fabric.max_restarts): " + what + where +
        "; every rank resumes from the newest complete checkpoint of this job");
    failed_step = reached;
    if (stop.wait_for(o.backoff)) return 128 + stop.signal();
  }
}

}  // namespace fabric
