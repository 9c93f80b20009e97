// fabric::remove_tree: what std::filesystem::remove_all does, without calling it.
#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path p = fs::path(tmp != nullptr ? tmp : "/tmp") / name;
  std::error_code ec;
  fabric::remove_tree(p, ec);
  fs::create_directories(p);
  return p;
}

TEST(RemoveTreeTest, DeletesAFolderTreeButNotWhatItsLinksPointTo) {
  const fs::path root = scratch("remove_tree");
  const fs::path outside = scratch("remove_tree_outside");
  std::ofstream(outside / "kept") << "k";
  fs::create_directories(root / "a" / "b" / "c");
  std::ofstream(root / "a" / "f") << "x";
  std::ofstream(root / "a" / "b" / "c" / "g") << "y";
  fs::create_directory_symlink(outside, root / "a" / "link");
  std::error_code ec;
  // root, a, b, c, f, g, link: 7 entries.
  EXPECT_EQ(fabric::remove_tree(root, ec), 7u);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(outside / "kept"));  // through the link, nothing
}

TEST(RemoveTreeTest, AFileAndAMissingPath) {
  const fs::path root = scratch("remove_tree_cases");
  std::ofstream(root / "file") << "x";
  std::error_code ec;
  EXPECT_EQ(fabric::remove_tree(root / "file", ec), 1u);
  EXPECT_FALSE(ec);
  EXPECT_EQ(fabric::remove_tree(root / "missing", ec), 0u);
  EXPECT_FALSE(ec);
}

}  // namespace

namespace {

// A std::filesystem error leaves a program as one line in the project's terms (run_main, sweep).
TEST(DescribeTest, FilesystemErrorsNameTheOperationThePathAndTheReason) {
  const std::filesystem::path file = scratch("describe") / "plain_file";
  std::ofstream(file) << "x";
  try {
    std::filesystem::create_directories(file / "sub");
    FAIL() << "created a folder under a file";
  } catch (const std::exception& e) {
    EXPECT_EQ(fabric::describe(e),
              "cannot create directories " + (file / "sub").string() + ": Not a directory");
  }
  EXPECT_EQ(fabric::describe(std::runtime_error("kept as it is")), "kept as it is");
}

}  // namespace
