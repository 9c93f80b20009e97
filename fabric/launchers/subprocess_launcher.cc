#include "fabric/launchers/subprocess_launcher.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>

#include "fabric/core/error.h"

extern char** environ;

namespace fabric {
namespace {

int pidfd_open(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

// The environment of a child: ours minus the variables set here, plus the child's.
std::vector<std::string> child_environment(int64_t rank, const LaunchOptions& o,
                                           const std::string& id) {
  std::vector<std::string> own = {"FABRIC_LOCAL_RANK=" + std::to_string(rank),
                                  "FABRIC_WORLD_SIZE=" + std::to_string(o.world_size),
                                  "FABRIC_MASTER_PORT=" + std::to_string(o.master_port),
                                  "FABRIC_LAUNCH_ID=" + id};
  own.insert(own.end(), o.env.begin(), o.env.end());
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var = *e;
    const std::string name = var.substr(0, var.find('=') + 1);
    const bool replaced = std::any_of(own.begin(), own.end(), [&](const std::string& mine) {
      return mine.compare(0, name.size(), name) == 0;
    });
    if (!replaced) env.push_back(var);
  }
  env.insert(env.end(), own.begin(), own.end());
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

bool alive(pid_t pid) { return kill(pid, 0) == 0; }

// This process's own command line (argv as started), from /proc/self/cmdline.
std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0')) args.push_back(arg);
  return args;
}

}  // namespace

std::string ChildExit::describe() const {
  const std::string who = "rank " + std::to_string(rank);
  if (signal != 0)
    return who + " was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return who + " exited with code " + std::to_string(code);
}

SubprocessLauncher::SubprocessLauncher(const LaunchOptions& options,
                                       const std::vector<std::string>& given_argv)
    : options_(options) {
  if (options_.world_size < 1) throw Error("SubprocessLauncher: world_size must be >= 1");
  const std::vector<std::string> argv = given_argv.empty() ? own_command_line() : given_argv;
  if (argv.empty()) throw Error("SubprocessLauncher: cannot read this process's command line");
  const std::string launch_id =
      std::to_string(getpid()) + "-" + std::to_string(std::random_device{}());
  const pid_t parent = getpid();
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  if (wake_fd_ < 0)
    throw Error(std::string("SubprocessLauncher: eventfd: ") + std::strerror(errno));

  if (options_.first_rank < 0) throw Error("SubprocessLauncher: first_rank must be >= 0");
  for (int64_t rank = options_.first_rank; rank < options_.world_size; ++rank) {
    // Everything the child needs is prepared before fork: between fork and exec only
    // async-signal-safe calls are allowed (this process may have many threads).
    std::vector<std::string> args = argv;
    std::vector<std::string> env = child_environment(rank, options_, launch_id);
    std::vector<char*> argp = pointers(args);
    std::vector<char*> envp = pointers(env);
    fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      stop_children(-1);
      throw Error("SubprocessLauncher: cannot start rank " + std::to_string(rank) +
                  ": fork: " + why);
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the parent died before prctl took effect
      execve("/proc/self/exe", argp.data(), envp.data());
      _exit(127);
    }
    const int fd = pidfd_open(pid);
    if (fd < 0) {
      const std::string why = std::strerror(errno);
      pids_.push_back(pid);
      stop_children(-1);
      throw Error("SubprocessLauncher: pidfd_open: " + why + " (Linux >= 5.3 is required)");
    }
    pids_.push_back(pid);
    pidfds_.push_back(fd);
  }
  running_ = static_cast<int>(pids_.size());
  monitor_ = std::thread([this] { monitor(); });
}

SubprocessLauncher::~SubprocessLauncher() {
  if (running_ > 0) stop_children(-1);
  const uint64_t one = 1;
  if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof(one)) < 0) {
    // Nothing to do: the monitor also ends once every child has exited.
  }
  if (monitor_.joinable()) monitor_.join();
  for (int fd : pidfds_) close(fd);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void SubprocessLauncher::monitor() {
  std::vector<bool> done(pids_.size(), false);
  while (running_ > 0) {
    // The interrupt descriptor (if any) is watched in the slot of the wake descriptor's partner.
    std::vector<pollfd> fds = {{wake_fd_, POLLIN, 0}, {options_.interrupt_fd, POLLIN, 0}};
    std::vector<size_t> index;
    for (size_t i = 0; i < pids_.size(); ++i) {
      if (done[i]) continue;
      fds.push_back({pidfds_[i], POLLIN, 0});
      index.push_back(i);
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents & POLLIN) return;  // the destructor asked us to stop
    if (fds[1].revents & POLLIN) {
      interrupted_ = true;
      stop_children(-1);
      return;
    }
    for (size_t k = 2; k < fds.size(); ++k) {
      if (!(fds[k].revents & (POLLIN | POLLHUP))) continue;
      const size_t i = index[k - 2];
      int status = 0;
      if (waitpid(pids_[i], &status, 0) < 0) continue;
      done[i] = true;
      --running_;
      const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      if (ok || stopping_) continue;
      ChildExit exit;
      exit.rank = static_cast<int64_t>(i) + options_.first_rank;
      exit.signal = WIFEXITED(status) ? 0 : WTERMSIG(status);
      exit.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + exit.signal;
      std::fprintf(stderr, "fabric: %s; stopping the job\n", exit.describe().c_str());
      stop_children(pids_[i]);
      std::fflush(nullptr);
      if (!options_.fail_fast) {
        failure_ = exit;
        return;
      }
      std::_Exit(exit.code);  // fail-fast: rank 0 may be blocked in a collective (see header)
    }
  }
}

void SubprocessLauncher::stop_children(pid_t except) {
  stopping_ = true;
  for (pid_t pid : pids_) {
    if (pid == except) continue;
    kill(pid, SIGTERM);
    kill(pid, SIGCONT);  // a stopped (frozen) rank acts on the SIGTERM now, not after the grace
  }
  const auto deadline = std::chrono::steady_clock::now() + options_.grace;
  for (pid_t pid : pids_) {
    if (pid == except) continue;
    // Reap if it is gone; otherwise wait for it until the grace period ends.
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, nullptr, WNOHANG) != 0 || !alive(pid)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (alive(pid)) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }
  running_ = 0;
}

int SubprocessLauncher::wait() {
  if (monitor_.joinable()) monitor_.join();
  if (interrupted_) return 128 + SIGINT;
  return failure_ ? failure_->code : 0;
}

}  // namespace fabric
