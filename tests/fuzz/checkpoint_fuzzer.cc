// libFuzzer harness (issue 7): the checkpoint reader (zip container + data-only pickle) must answer
// any file with a value or a fabric::Error, never a crash, another exception, or running code.
// Property checked (a violation aborts): the error names the file.
//   bazel build --config=fuzz //tests/fuzz:checkpoint_fuzzer
//   bazel-bin/tests/fuzz/checkpoint_fuzzer -max_total_time=60 tests/fuzz/corpus/checkpoint
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "fabric/checkpoint/archive.h"
#include "fabric/core/error.h"

namespace {

// The input file, removed when the fuzzer exits (an aborting run leaves it for the reproducer).
struct InputFile {
  std::string path = "/dev/shm/fabric_checkpoint_fuzz_" + std::to_string(getpid());
  ~InputFile() { std::remove(path.c_str()); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const InputFile file;
  const std::string& path = file.path;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    (void)fabric::load_archive(path);
  } catch (const fabric::Error& e) {
    // The expected answer to a bad file, naming it.
    if (std::string(e.what()).find(path) == std::string::npos) {
      std::fprintf(stderr, "checkpoint_fuzzer: the error does not name the file: %s\n", e.what());
      std::abort();
    }
  }
  return 0;
}
