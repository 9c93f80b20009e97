// Where user-given relative paths (configs, data roots, run directories) are resolved.
//
// Under `bazel run` the program runs inside its runfiles tree; the directory the user typed the
// command in is BUILD_WORKING_DIRECTORY and the workspace is BUILD_WORKSPACE_DIRECTORY.
#ifndef FABRIC_CORE_PATHS_H_
#define FABRIC_CORE_PATHS_H_

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fabric {

// BUILD_WORKING_DIRECTORY when set (bazel run), else the current directory.
std::filesystem::path working_directory();

// BUILD_WORKSPACE_DIRECTORY when set (bazel run), else nullopt.
std::optional<std::filesystem::path> workspace_directory();

// The runfiles folder of this binary's main repository (RUNFILES_DIR, TEST_SRCDIR, or
// /proc/self/exe + ".runfiles"), when one exists.
std::optional<std::filesystem::path> runfiles_directory();

// `path` made absolute against working_directory().
std::filesystem::path absolute_from_working_directory(const std::filesystem::path& path);

// The candidates for an input file named `name`, in search order, without duplicates:
//   1. `name` itself when absolute;
//   2. working_directory() / name;
//   3. for each `dir` of `extra_dirs` (e.g. $FABRIC_CONFIG_DIR): dir / name;
//   4. workspace_directory() / subdir / name;
//   5. runfiles_directory() / subdir / name.
std::vector<std::filesystem::path> search_candidates(const std::filesystem::path& name,
                                                     const std::string& subdir,
                                                     const std::vector<std::string>& extra_dirs);

// `path` relative to working_directory() when inside it (for messages), else unchanged.
std::string display_path(const std::filesystem::path& path);

}  // namespace fabric

#endif  // FABRIC_CORE_PATHS_H_
