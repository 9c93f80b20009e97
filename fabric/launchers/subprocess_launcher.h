// fabric::SubprocessLauncher: self-launch of a job on this machine. The calling process is rank 0;
// the launcher starts ranks 1..N-1 as copies of the running executable with the same arguments and
// FABRIC_LOCAL_RANK, FABRIC_WORLD_SIZE, FABRIC_MASTER_PORT (and FABRIC_LAUNCH_ID) in their
// environment (see fabric/environments/environments.h), then supervises them:
//
//   - a child that exits non-zero or dies from a signal stops the job: the launcher prints
//     "fabric: rank R exited with code C; stopping the job" (or "was killed by signal S"), sends
//     SIGTERM to the other children, SIGKILL after the grace period, and ends this process with the
//     child's code (128 + signal for a signal) — fail-fast, so no rank waits for a collective
//     timeout. This is the one place where Fabric ends the process itself: rank 0 may be blocked in
//     a collective that will never complete;
//   - children die with their parent (PR_SET_PDEATHSIG = SIGKILL): killing rank 0, even with
//     SIGKILL, leaves no orphans; Ctrl-C reaches every process of the foreground group;
//   - wait() (after rank 0's own work) waits for every child and returns 0, or the first failure.
//
// The restart agent (fabric/distributed/restart_agent.h) uses it with first_rank = 0 and
// fail_fast = false: every rank is a child, and a failure stops the others and returns from wait()
// (failure() says which rank and how) instead of ending this process.
//
// Children are watched through pidfds: the launcher never reaps processes it did not start, so
// std::system() and other child processes of the program keep working.
//
// Not copyable; one launcher per process; construct it from the thread that will call wait().
#ifndef FABRIC_LAUNCHERS_SUBPROCESS_LAUNCHER_H_
#define FABRIC_LAUNCHERS_SUBPROCESS_LAUNCHER_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace fabric {

struct LaunchOptions {
  int64_t world_size = 1;                 // processes in the job, rank 0 included
  int master_port = 0;                    // handed to children as FABRIC_MASTER_PORT
  std::chrono::milliseconds grace{5000};  // SIGTERM → SIGKILL. Default: 5 s.
  int64_t first_rank = 1;  // the first rank started as a child (0: this process only supervises)
  // "NAME=VALUE" added to every child's environment (replacing NAME if this process has it).
  std::vector<std::string> env;
  // true: a failing child ends this process (above). false: it stops the other children and
  // wait() returns its status; failure() says which rank.
  bool fail_fast = true;
  // fail_fast = false only: once this descriptor is readable (e.g. a signal handler wrote to a
  // pipe), every child is stopped and wait() returns 128 + SIGINT with interrupted() true.
  int interrupt_fd = -1;
};

// How a child ended: exit status `code` (128 + signal for a signal, as a shell reports it).
struct ChildExit {
  int64_t rank = -1;
  int code = 0;
  int signal = 0;  // 0: it exited
  // "rank 1 was killed by signal 9 (Killed)" or "rank 1 exited with code 1".
  std::string describe() const;
};

class SubprocessLauncher {
 public:
  // Starts ranks 1..world_size-1 with `argv` (argv[0] is kept; the executable is /proc/self/exe);
  // an empty `argv` means this process's own command line (/proc/self/cmdline).
  // Throws fabric::Error if a process cannot be started (the ones already started are stopped).
  SubprocessLauncher(const LaunchOptions& options, const std::vector<std::string>& argv);
  // Stops children that are still running (SIGTERM, then SIGKILL) and joins the monitor.
  ~SubprocessLauncher();
  SubprocessLauncher(const SubprocessLauncher&) = delete;
  SubprocessLauncher& operator=(const SubprocessLauncher&) = delete;

  // Waits until every child has exited; returns 0 when all exited 0. (Under fail_fast a failing
  // child ends the process before wait() returns, see above; otherwise wait() returns its code.)
  int wait();
  // After wait(): the first child that failed (fail_fast = false); nullopt when none did.
  const std::optional<ChildExit>& failure() const { return failure_; }
  // After wait(): the interrupt descriptor fired (fail_fast = false).
  bool interrupted() const { return interrupted_; }

  const std::vector<pid_t>& child_pids() const { return pids_; }

 private:
  void monitor();
  void stop_children(pid_t except);

  LaunchOptions options_;
  std::vector<pid_t> pids_;  // index r-1 holds rank r
  std::vector<int> pidfds_;
  int wake_fd_ = -1;  // eventfd: tells the monitor to stop
  std::atomic<int> running_{0};
  std::atomic<bool> stopping_{false};  // children are being stopped on purpose: not failures
  std::optional<ChildExit> failure_;   // written by the monitor before it ends
  bool interrupted_ = false;           // likewise
  std::thread monitor_;
};

}  // namespace fabric

#endif  // FABRIC_LAUNCHERS_SUBPROCESS_LAUNCHER_H_
