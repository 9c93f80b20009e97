#include "fabric/core/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "fabric/core/error.h"

namespace fabric {
namespace {

std::atomic<int> terminal_fd{-1};  // a duplicate of the original stderr once redirected

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void redirect_output_to_file(const std::string& file) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot open log file " + file + ": " + std::strerror(errno));
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  if (terminal_fd.load() < 0) terminal_fd = ::fcntl(2, F_DUPFD_CLOEXEC, 3);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::close(fd);
}

void write_to_terminal(const std::string& line) {
  std::cerr << line << std::endl;
  const int fd = terminal_fd.load();
  if (fd >= 0) write_all(fd, line + "\n");
}

}  // namespace fabric
