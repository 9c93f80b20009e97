#include "tools/sweep/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "fabric/core/error.h"

namespace fabric::sweep {

namespace fs = std::filesystem;

int status_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

pid_t spawn(const std::vector<std::string>& argv, const fs::path& cwd, int out_fd,
            const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error(std::string("cannot start a run: fork failed: ") + std::strerror(errno));
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);
    dup2(out_fd, STDOUT_FILENO);
    dup2(out_fd, STDERR_FILENO);
    if (chdir(cwd.c_str()) != 0) {
      dprintf(STDERR_FILENO, "sweep: cannot enter %s: %s\n", cwd.c_str(), std::strerror(errno));
      _exit(127);
    }
    // A program started by `bazel run` resolves relative paths against BUILD_WORKING_DIRECTORY
    // (fabric/core/paths.h): the run's working directory is `cwd`.
    if (getenv("BUILD_WORKING_DIRECTORY") != nullptr)
      setenv("BUILD_WORKING_DIRECTORY", cwd.c_str(), 1);
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    execv(args[0], args.data());
    dprintf(STDERR_FILENO, "sweep: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also here, so that a signal sent right away reaches the group
  return pid;
}

std::string last_line(const std::string& text) {
  size_t end = text.find_last_not_of(" \t\r\n");
  if (end == std::string::npos) return "";
  size_t begin = text.find_last_of("\r\n", end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

std::string last_line_of_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 65536);
  in.seekg(from);
  std::string text(static_cast<size_t>(size - from), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  return last_line(text);
}

Captured run_captured(const std::vector<std::string>& argv, const fs::path& cwd) {
  Captured result;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw Error(std::string("pipe: ") + std::strerror(errno));
  pid_t pid;
  try {
    pid = spawn(argv, cwd, fds[1], {});
  } catch (...) {
    close(fds[0]);
    close(fds[1]);
    throw;
  }
  close(fds[1]);
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    result.output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.code = status_code(status);
  return result;
}

}  // namespace fabric::sweep
