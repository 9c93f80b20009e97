#include "fabric/core/atomic_file.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "fabric/core/error.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

// Fault injection for tests (atomic_file.h): the byte count at which this process fails or dies.
int64_t fault_threshold(const char* variable) {
  const char* v = std::getenv(variable);
  return v != nullptr && *v != '\0' ? std::atoll(v) : -1;
}
int64_t bytes_written_so_far = 0;  // by write_file_atomically in this process

}  // namespace

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error("cannot open folder " + dir.string() + ": " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) throw Error("cannot sync folder " + dir.string() + ": " + std::strerror(err));
}

AtomicFile::AtomicFile(fs::path path)
    : path_(std::move(path)), tmp_(path_.string() + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create " + tmp_.string(), errno);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw Error("cannot write " + path_.string() + ": " + what + ": " + std::strerror(err));
}

void AtomicFile::write(std::string_view bytes) {
  static const int64_t fail_after = fault_threshold("FABRIC_TEST_FAIL_WRITE_AFTER_BYTES");
  static const int64_t kill_after = fault_threshold("FABRIC_TEST_KILL_AFTER_BYTES");
  constexpr size_t kChunk = size_t{1} << 20;
  if (fd_ < 0) throw Error("cannot write " + path_.string() + ": the file was closed");
  size_t done = 0;
  while (done < bytes.size()) {
    if (fail_after >= 0 && bytes_written_so_far >= fail_after) fail("write failed", ENOSPC);
    if (kill_after >= 0 && bytes_written_so_far >= kill_after) std::raise(SIGKILL);
    size_t want = std::min(kChunk, bytes.size() - done);
    for (const int64_t limit : {fail_after, kill_after})
      if (limit > bytes_written_so_far)
        want = std::min(want, static_cast<size_t>(limit - bytes_written_so_far));
    const ssize_t n = ::write(fd_, bytes.data() + done, want);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("write failed", n < 0 ? errno : EIO);
    done += static_cast<size_t>(n);
    bytes_written_so_far += n;
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error("cannot write " + path_.string() + ": the file was closed");
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error("cannot write " + path_.string() + ": close failed: " + std::strerror(err));
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    throw Error("cannot write " + path_.string() + ": rename failed: " + std::strerror(err));
  }
  sync_directory(path_.parent_path());
}

void write_file_atomically(const fs::path& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes);
  file.commit();
}

namespace {

// nftw's callback has no user argument: the count and the first error of the walk in progress
// (one walk at a time per thread).
thread_local std::uintmax_t t_removed = 0;
thread_local int t_errno = 0;

int remove_entry(const char* path, const struct stat*, int, struct FTW*) {
  if (::remove(path) != 0) {
    t_errno = errno;
    return 1;  // stop the walk
  }
  ++t_removed;
  return 0;
}

}  // namespace

std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept {
  ec.clear();
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT) ec.assign(errno, std::generic_category());
    return 0;
  }
  t_removed = 0;
  t_errno = 0;
  // Depth first (a folder after its entries), not following symbolic links, up to 64 open
  // folders at a time.
  const int rc = ::nftw(path.c_str(), remove_entry, 64, FTW_DEPTH | FTW_PHYS);
  if (rc != 0) ec.assign(t_errno != 0 ? t_errno : errno, std::generic_category());
  return t_removed;
}

}  // namespace fabric
