// Crash-safe file writing: a reader sees either the old file or the complete new one, never a
// partial write, even if the process is killed or the machine loses power mid-write.
#ifndef FABRIC_CORE_ATOMIC_FILE_H_
#define FABRIC_CORE_ATOMIC_FILE_H_

#include <filesystem>
#include <string>
#include <string_view>

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

}  // namespace fabric

#endif  // FABRIC_CORE_ATOMIC_FILE_H_
