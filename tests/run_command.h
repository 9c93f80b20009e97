// Test helpers for tests that start processes: run a shell command (exit status and
// stdout+stderr), find a helper program in the runfiles, read a value or every rank's report from
// the output, the Python with torch, a free loopback port.
#ifndef TESTS_RUN_COMMAND_H_
#define TESTS_RUN_COMMAND_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fabric::testing {

struct CommandResult {
  int code = -1;    // exit status, or 128 + signal
  std::string out;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// The program built by Bazel target `label` (e.g. "//tests/integration:ddp_parity_helper"), which
// must be in the test's data: its path in the runfiles tree (a test's working directory). Throws
// std::runtime_error naming the label and the fix when it is not there.
inline std::string helper_binary(const std::string& label) {
  const auto colon = label.find(':');
  if (label.rfind("//", 0) != 0 || colon == std::string::npos)
    throw std::runtime_error("helper_binary: '" + label + "' is not a label like //pkg:name");
  const std::filesystem::path path =
      std::filesystem::current_path() / label.substr(2, colon - 2) / label.substr(colon + 1);
  if (!std::filesystem::exists(path))
    throw std::runtime_error("helper_binary: " + label + " is not in this test's runfiles (" +
                             path.string() + "): add it to the test's data");
  return path.string();
}

// The ranks in [0, world) whose report is missing from `out`: the text "rank R" + `rest`, with R
// the rank (helpers print e.g. "rank 2 of 4: ok", so rest = " of 4: ok"). Empty: every rank
// reported.
inline std::vector<int> ranks_missing_report(const std::string& out, int world,
                                             const std::string& rest) {
  std::vector<int> missing;
  for (int rank = 0; rank < world; ++rank)
    if (out.find("rank " + std::to_string(rank) + rest) == std::string::npos)
      missing.push_back(rank);
  return missing;
}

// The rest of the line after the first `key` in `text` ("" when absent): "params_hash=" → hash.
inline std::string value_after(const std::string& text, const std::string& key) {
  const auto pos = text.find(key);
  if (pos == std::string::npos) return "";
  const auto start = pos + key.size();
  return text.substr(start, text.find('\n', start) - start);
}

// The Python with the setup's torch: $PYTHON (tests set it from TORCH_PYTHON), else python3.
inline std::string python_interpreter() {
  const char* py = std::getenv("PYTHON");
  return py != nullptr && *py != '\0' ? py : "python3";
}

// Runs `program` (Python source, written to `dir`/program.py) with the setup's Python and `arg`
// as its one argument.
inline CommandResult run_python(const std::string& program, const std::filesystem::path& dir,
                                const std::string& arg) {
  const std::filesystem::path script = dir / "program.py";
  std::ofstream(script) << program;
  return run_command(python_interpreter() + " " + script.string() + " " + arg);
}

// A TCP port nothing listens on right now on 127.0.0.1 (the kernel's choice for port 0).
inline int free_loopback_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace fabric::testing

#endif  // TESTS_RUN_COMMAND_H_
