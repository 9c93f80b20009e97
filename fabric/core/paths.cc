#include "fabric/core/paths.h"

#include <unistd.h>

#include <cstdlib>

namespace fs = std::filesystem;

namespace fabric {
namespace {

std::optional<fs::path> env_path(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return fs::path(value);
}

}  // namespace

fs::path working_directory() {
  if (auto dir = env_path("BUILD_WORKING_DIRECTORY")) return *dir;
  std::error_code ec;
  fs::path cwd = fs::current_path(ec);
  return ec ? fs::path(".") : cwd;
}

std::optional<fs::path> workspace_directory() { return env_path("BUILD_WORKSPACE_DIRECTORY"); }

std::optional<fs::path> runfiles_directory() {
  std::error_code ec;
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (auto dir = env_path(var)) {
      if (fs::is_directory(*dir / "fabricpp", ec)) return *dir / "fabricpp";
    }
  }
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return std::nullopt;
  fs::path runfiles = exe.string() + ".runfiles";
  if (fs::is_directory(runfiles / "fabricpp", ec)) return runfiles / "fabricpp";
  return std::nullopt;
}

fs::path absolute_from_working_directory(const fs::path& path) {
  return path.is_absolute() ? path : (working_directory() / path).lexically_normal();
}

std::vector<fs::path> search_candidates(const fs::path& name, const std::string& subdir,
                                        const std::vector<std::string>& extra_dirs) {
  std::vector<fs::path> out;
  auto add = [&out](const fs::path& p) {
    fs::path normal = p.lexically_normal();
    for (const auto& q : out)
      if (q == normal) return;
    out.push_back(normal);
  };
  if (name.is_absolute()) {
    add(name);
    return out;
  }
  add(working_directory() / name);
  for (const auto& dir : extra_dirs)
    if (!dir.empty()) add(fs::path(dir) / name);
  if (auto ws = workspace_directory()) add(*ws / subdir / name);
  if (auto rf = runfiles_directory()) add(*rf / subdir / name);
  return out;
}

std::string display_path(const fs::path& path) {
  const fs::path base = working_directory().lexically_normal();
  const fs::path normal = path.lexically_normal();
  fs::path rel = normal.lexically_relative(base);
  if (!rel.empty() && *rel.begin() != "..") return rel.string();
  return normal.string();
}

}  // namespace fabric
