// Child processes of the sweep tool: started in their own process group, dying with the sweep
// (PR_SET_PDEATHSIG), output to a file descriptor (spawn) or captured (run_captured); and the
// last line of a program's output, which is where Fabric programs put their one-line errors.
#ifndef TOOLS_SWEEP_PROCESS_H_
#define TOOLS_SWEEP_PROCESS_H_

#include <sys/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fabric::sweep {

// A waitpid status as an exit status: the exit code, or 128 + the signal.
int status_code(int status);

// fork + exec of `argv` (argv[0] a path) in `cwd`; in the child: own process group, dies with the
// parent (SIGTERM), signals unblocked, stdout and stderr to `out_fd`, `env` set. Returns the pid;
// throws fabric::Error when fork fails.
pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& cwd, int out_fd,
            const std::vector<std::pair<std::string, std::string>>& env);

struct Captured {
  int code = -1;  // exit status, or 128 + signal
  std::string output;
};
// Runs `argv` in `cwd` and returns its status and combined stdout + stderr.
Captured run_captured(const std::vector<std::string>& argv, const std::filesystem::path& cwd);

// The last non-empty line of `text` (of a file's last 64 KiB for last_line_of_file).
std::string last_line(const std::string& text);
std::string last_line_of_file(const std::filesystem::path& path);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_PROCESS_H_
