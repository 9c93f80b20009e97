// A FIFO given where a data file belongs (data.root's train.bin, a .npy) is refused at once with
// one line, not waited on forever: every data reader opens with O_NONBLOCK and checks for a
// regular file (issue 67: a FIFO hung the programs that read it).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "fabric/core/error.h"
#include "fabric/data/npy.h"
#include "fabric/data/tokens.h"

namespace fs = std::filesystem;

namespace {

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(FifoTest, DataReadersRefuseAFifoInsteadOfWaiting) {
  const fs::path dir = fs::path(::testing::TempDir()) / "fifo_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path fifo = dir / "train.bin";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { fabric::TokenDataset::open(fifo.string(), {.block_size = 8}); }),
            fifo.string() + ": not a regular file");
  EXPECT_EQ(error_of([&] { fabric::NpyDataset::open(fifo.string(), fifo.string()); }),
            fifo.string() + ": not a regular file");
}

}  // namespace
