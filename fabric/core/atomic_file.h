// Crash-safe file writing: a reader sees either the old file or the complete new one, never a
// partial write, even if the process is killed or the machine loses power mid-write.
#ifndef FABRIC_CORE_ATOMIC_FILE_H_
#define FABRIC_CORE_ATOMIC_FILE_H_

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace fabric {

// Writes `bytes` to `path`: a temporary file in the same folder (PATH.tmp.PID), flushed and
// fsynced, renamed over `path`, then the folder fsynced. Throws fabric::Error
// "cannot write PATH: <reason>" (the temporary file is removed; an existing `path` is untouched).
//
// Fault injection, for tests only (crash and disk-full trials): once this process has written N
// bytes through this function in all, FABRIC_TEST_FAIL_WRITE_AFTER_BYTES=N makes the write fail
// with ENOSPC, FABRIC_TEST_KILL_AFTER_BYTES=N makes the process SIGKILL itself.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

// The same written in pieces (a large archive streamed without holding it in memory): the
// constructor creates the temporary file, write() appends (fault injection included), commit()
// fsyncs and renames it over `path`. Destroyed without commit(), the temporary file is removed
// and `path` untouched. Each call throws fabric::Error "cannot write PATH: <reason>".
class AtomicFile {
 public:
  explicit AtomicFile(std::filesystem::path path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(std::string_view bytes);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::filesystem::path path_, tmp_;
  int fd_ = -1;
};

// fsyncs a folder so that renames inside it survive a crash. Throws fabric::Error on failure.
void sync_directory(const std::filesystem::path& dir);

// Deletes `path` and, when it is a folder, everything under it (symbolic links themselves, not
// what they point to), like std::filesystem::remove_all; a missing `path` is no error. Returns
// how many entries it deleted, or sets `ec` (stopping at the first failure) and returns what it
// deleted until then. Use this, not std::filesystem::remove_all: the torch wheel's libtorch.so
// exports its own copy of remove_all, which jumps to address 0; a program that links libtorch.so
// before libstdc++ (CMake's ${TORCH_LIBRARIES} does) calls that copy (reproduced with LibTorch
// 2.11; its other std::filesystem exports work). tools/ci_checks.sh keeps remove_all out of the
// library.
std::uintmax_t remove_tree(const std::filesystem::path& path, std::error_code& ec) noexcept;

}  // namespace fabric

#endif  // FABRIC_CORE_ATOMIC_FILE_H_
