// libFuzzer harness (issue 20): the tar and WebDataset readers must answer any bytes with members
// or a fabric::Error, never a crash, a hang, another exception or a sanitizer report. Properties
// checked (a violation aborts): an error is one non-empty line; every member lies inside the file
// and can be read; samples only hold members of the listing.
// Input: the bytes of a tar file (given to the readers as a memfd's /proc/self/fd path).
//   bazel build --config=fuzz //tests/fuzz:tar_fuzzer
//   bazel-bin/tests/fuzz/tar_fuzzer -max_total_time=600 -rss_limit_mb=4096 tests/fuzz/corpus/tar
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fabric/core/error.h"
#include "fabric/data/webdataset.h"

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "tar_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void check_error(const fabric::Error& e) {
  const std::string what = e.what();
  require(!what.empty() && what.find('\n') == std::string::npos, "one-line error", what);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("tar_fuzzer", MFD_CLOEXEC);
  require(fd >= 0, "memfd", "");
  require(ftruncate(fd, 0) == 0, "ftruncate", "");
  size_t written = 0;
  while (written < size) {
    const ssize_t n = pwrite(fd, data + written, size - written, static_cast<off_t>(written));
    require(n > 0, "pwrite", "");
    written += static_cast<size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    for (const auto& m : fabric::list_tar(path)) {
      require(m.offset >= 0 && m.size >= 0 && m.offset + m.size <= static_cast<int64_t>(size),
              "member inside the file", m.name);
      (void)fabric::read_file_range(path, m.offset, m.size, m.name);
    }
  } catch (const fabric::Error& e) {
    check_error(e);
  }
  try {
    for (const auto& s : fabric::index_webdataset({path})) {
      require(!s.members.empty(), "a sample has members", s.key);
      for (const auto& [ext, m] : s.members)
        require(!ext.empty() && m.offset + m.size <= static_cast<int64_t>(size), "member", m.name);
    }
  } catch (const fabric::Error& e) {
    check_error(e);
  }
  return 0;
}
