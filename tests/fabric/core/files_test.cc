// fabric/core/files.h: the regular-file check readers make before opening (a FIFO would block
// open() forever) and the output check writers make (never over an input).
#include "fabric/core/files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "fabric/core/error.h"

namespace fs = std::filesystem;

namespace fabric {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  fs::path touch(const std::string& name) {
    const fs::path p = dir_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << "x";
    return p;
  }
  // The message of what `f` throws ("" when it throws nothing).
  template <class F>
  static std::string error_of(F f) {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

TEST_F(FilesTest, OnlyARegularFileIsOpened) {
  const fs::path fifo = dir_ / "weights.pt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(error_of([&] { require_regular_file(fifo); }),
            fifo.string() + ": cannot open (a FIFO (named pipe), not a regular file)");
  EXPECT_EQ(error_of([&] { require_regular_file(dir_); }),
            dir_.string() + ": cannot open (a folder, not a file)");
  EXPECT_EQ(error_of([&] { require_regular_file(dir_ / "absent"); }),
            (dir_ / "absent").string() + ": cannot open (No such file or directory)");
  EXPECT_EQ(error_of([&] { require_regular_file("/dev/null"); }),
            "/dev/null: cannot open (a character device, not a regular file)");
  EXPECT_EQ(error_of([&] { require_regular_file(touch("a.pt")); }), "");
  // Through a link: what it points to counts.
  fs::create_symlink(fifo, dir_ / "link.pt");
  EXPECT_NE(error_of([&] { require_regular_file(dir_ / "link.pt"); }).find("a FIFO"),
            std::string::npos);
}

TEST_F(FilesTest, AnOutputNeverReplacesAnInput) {
  const fs::path in = touch("data/val.bin");
  const std::vector<InputPath> inputs = {{in, "--input"}};
  EXPECT_EQ(error_of([&] { check_output_path(in, "--output", inputs); }),
            in.string() + ": is the input " + in.string() +
                " (--input), which writing would replace; choose another --output");
  // The same file by another spelling, a symbolic link or a hard link.
  EXPECT_NE(error_of([&] { check_output_path(dir_ / "data/../data/./val.bin", "o", inputs); }), "");
  fs::create_symlink(in, dir_ / "sym.bin");
  EXPECT_NE(error_of([&] { check_output_path(dir_ / "sym.bin", "o", inputs); }), "");
  fs::create_hard_link(in, dir_ / "hard.bin");
  EXPECT_NE(error_of([&] { check_output_path(dir_ / "hard.bin", "o", inputs); }), "");
  // Another file beside it is fine.
  EXPECT_EQ(error_of([&] { check_output_path(dir_ / "data/train.bin", "o", inputs); }), "");
}

TEST_F(FilesTest, AFolderReadWholeTakesNoOutputAndADataFolderKeepsItsFiles) {
  touch("corpus/a.txt");
  const std::vector<InputPath> whole = {{dir_ / "corpus", "--input"}};
  const std::string inside =
      error_of([&] { check_output_path(dir_ / "corpus" / "out", "--output", whole); });
  EXPECT_EQ(inside, (dir_ / "corpus" / "out").string() + ": lies inside the input folder " +
                        (dir_ / "corpus").string() +
                        " (--input), whose every file is read: a later run would read this "
                        "output as input; choose another --output outside it");
  EXPECT_NE(error_of([&] { check_output_path(dir_ / "corpus", "--output", whole); }), "");
  EXPECT_EQ(error_of([&] { check_output_path(dir_ / "corpus2" / "out", "o", whole); }), "")
      << "a sibling whose name starts alike is outside";

  const fs::path val = touch("data/val.bin");
  const std::vector<InputPath> part = {{dir_ / "data", "data.root", false}};
  EXPECT_EQ(error_of([&] { check_output_path(val, "checkpoint.export_weights", part); }),
            val.string() + ": is an existing file inside the input folder " +
                (dir_ / "data").string() +
                " (data.root), which writing would replace; choose another "
                "checkpoint.export_weights");
  EXPECT_EQ(error_of([&] { check_output_path(dir_ / "data" / "w.pt", "o", part); }), "")
      << "a new file in a data folder is fine";
  EXPECT_TRUE(path_within(dir_ / "data" / "x" / ".." / "val.bin", dir_ / "data"));
  EXPECT_FALSE(path_within(dir_ / "database", dir_ / "data"));
}

}  // namespace
}  // namespace fabric
