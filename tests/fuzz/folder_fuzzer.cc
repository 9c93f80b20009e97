// libFuzzer harness: a sharded checkpoint folder (fabric/checkpoint/sharded.h) with any contents
// must be read (read_checkpoint) and verified (verify_checkpoint) into a dict or a fabric::Error
// naming the folder, never a crash, another exception or a sanitizer report.
// Input: the folder's files, each a 4-byte little-endian length and that many bytes, in the order
// manifest.json, common.pt, shard-00000-of-00001.pt, shard-00000-of-00002.pt,
// shard-00001-of-00002.pt (files the input does not reach are absent).
//   bazel build --config=fuzz //tests/fuzz:folder_fuzzer
//   bazel-bin/tests/fuzz/folder_fuzzer -max_total_time=60 tests/fuzz/corpus/folder
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace {

namespace fs = std::filesystem;

constexpr const char* kFiles[] = {"manifest.json", "common.pt", "shard-00000-of-00001.pt",
                                  "shard-00000-of-00002.pt", "shard-00001-of-00002.pt"};

// The folder, removed when the fuzzer exits (an aborting run leaves it for the reproducer).
struct Folder {
  fs::path root = "/dev/shm/fabric_folder_fuzz_" + std::to_string(getpid());
  fs::path path = root / "step-00000001.ckpt";
  ~Folder() {
    std::error_code ec;
    fabric::remove_tree(root, ec);
  }
};

void check(const fabric::Error& e, const fs::path& folder) {
  if (std::string(e.what()).find(folder.string()) != std::string::npos) return;
  std::fprintf(stderr, "folder_fuzzer: the error does not name the folder: %s\n", e.what());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Folder folder;
  std::error_code ec;
  fabric::remove_tree(folder.path, ec);
  fs::create_directories(folder.path);
  size_t at = 0;
  for (const char* name : kFiles) {
    if (at + 4 > size) break;
    const uint32_t n = static_cast<uint32_t>(data[at]) | static_cast<uint32_t>(data[at + 1]) << 8 |
                       static_cast<uint32_t>(data[at + 2]) << 16 |
                       static_cast<uint32_t>(data[at + 3]) << 24;
    at += 4;
    const size_t len = std::min<size_t>(n, size - at);
    std::ofstream(folder.path / name, std::ios::binary)
        .write(reinterpret_cast<const char*>(data + at), static_cast<std::streamsize>(len));
    at += len;
  }
  try {
    (void)fabric::read_checkpoint(folder.path);
  } catch (const fabric::Error& e) {
    check(e, folder.path);
  }
  try {
    fabric::verify_checkpoint(folder.path);
  } catch (const fabric::Error& e) {
    check(e, folder.path);
  }
  return 0;
}
