#include "fabric/core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "fabric/core/error.h"

namespace fabric {
namespace fs = std::filesystem;

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open folder " + dir.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot sync folder " + dir.string() + ": " + std::strerror(err));
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  const fs::path tmp = path.string() + ".tmp." + std::to_string(::getpid());
  auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    throw Error("cannot write " + path.string() + ": " + what + ": " + std::strerror(err));
  };
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create " + tmp.string(), errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      fail("write failed", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync failed", err);
  }
  if (::close(fd) != 0) fail("close failed", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename failed", errno);
  sync_directory(path.parent_path());
}

}  // namespace fabric
