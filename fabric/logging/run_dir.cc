#include "fabric/logging/run_dir.h"

#include <algorithm>

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/hash.h"
#include "fabric/core/output.h"
#include "fabric/core/paths.h"

namespace fs = std::filesystem;

namespace fabric {

std::string expand_fields(const std::string& pattern,
                          const std::vector<std::pair<std::string, std::string>>& fields) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '{') {
      out += pattern[i];
      continue;
    }
    const size_t close = pattern.find('}', i);
    if (close == std::string::npos) throw Error("unclosed '{' in '" + pattern + "'");
    const std::string field = pattern.substr(i + 1, close - i - 1);
    auto it =
        std::find_if(fields.begin(), fields.end(), [&](const auto& f) { return f.first == field; });
    if (it == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += (known.empty() ? "{" : ", {") + f.first + "}";
      throw Error("unknown field '{" + field + "}' in '" + pattern + "' (fields: " + known + ")");
    }
    out += it->second;
    i = close;
  }
  return out;
}

std::string expand_run_dir(const std::string& pattern, const std::string& name,
                           const std::string& timestamp, const std::string& hash) {
  try {
    return expand_fields(pattern, {{"name", name}, {"timestamp", timestamp}, {"hash", hash}});
  } catch (const Error& e) {
    throw Error(std::string("logging.run_dir: ") + e.what());
  }
}

std::string run_dir_hash(const Config& config) {
  // checkpoint.* and logging.* are the run's bookkeeping, as Fabric::load's config comparison
  // leaves them out: `checkpoint.resume=auto` added to the same command must find the folder.
  std::string text;
  for (const auto& [key, value] : config_leaves(config.to_yaml()))
    if (key.rfind("checkpoint.", 0) != 0 && key.rfind("logging.", 0) != 0)
      text += key + ": " + value + "\n";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a64(text)));
  return hex;
}

RunDirectory RunDirectory::create(const Config& config, const std::string& name,
                                  bool is_global_zero) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&now));
  std::string expanded;
  try {
    expanded =
        expand_run_dir(config.get_string("logging.run_dir"), name, stamp, run_dir_hash(config));
  } catch (const Error& e) {
    throw config.error_at("logging.run_dir", e.what());
  }
  fs::path base = absolute_from_working_directory(expanded);
  fs::path path = base;
  std::error_code ec;
  for (int n = 1; fs::exists(path, ec) && !fs::is_empty(path, ec); ++n)
    path = base.string() + "-" + std::to_string(n);
  if (!is_global_zero) return RunDirectory(path, false);
  fs::create_directories(path, ec);
  if (ec) throw Error("cannot create run directory " + path.string() + ": " + ec.message());
  write_file_atomically(path / "config.yaml",
                        "# resolved config (hash " + config.hash() + ")\n" + config.to_yaml());
  return RunDirectory(path, true);
}

RunDirectory RunDirectory::create(
    const Config& config, const std::string& name, int64_t rank, int64_t world_size,
    const std::function<std::string(const std::string&)>& share_from_rank0) {
  if (world_size <= 1) return create(config, name, true);
  // Rank 0 creates the folder before sharing its path: every rank then names the same one.
  const std::string path = rank == 0 ? create(config, name, true).path_.string() : std::string();
  RunDirectory shared(share_from_rank0(path), rank == 0);
  if (rank != 0)
    redirect_output_to_file((shared.path_ / ("rank_" + std::to_string(rank) + ".log")).string());
  return shared;
}

fs::path RunDirectory::write_summary(const nlohmann::json& summary) const {
  const fs::path file = path_ / "summary.json";
  // Invalid UTF-8 in a string (a generated text sample, a path) becomes U+FFFD, not an exception.
  if (writer_)
    write_file_atomically(
        file, summary.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  return file;
}

namespace {

constexpr char kAnyTimestamp = '\x01';  // stands for {timestamp} while searching earlier runs
constexpr char kAnySuffix = '\x02';     // the "-N" a run directory may carry

// Folders matching `pattern`, whose components may hold kAnyTimestamp / kAnySuffix.
std::vector<fs::path> matching_folders(const fs::path& pattern) {
  std::vector<fs::path> found = {pattern.root_path()};
  for (const auto& part : pattern.relative_path()) {
    const std::string p = part.string();
    std::vector<fs::path> next;
    if (p.find(kAnyTimestamp) == std::string::npos && p.find(kAnySuffix) == std::string::npos) {
      for (const auto& f : found)
        if (std::error_code ec; fs::is_directory(f / part, ec)) next.push_back(f / part);
    } else {
      std::string re;
      for (char ch : p) {
        if (ch == kAnyTimestamp)
          re += "[0-9]{8}-[0-9]{6}";
        else if (ch == kAnySuffix)
          re += "(-[0-9]+)?";
        else if (std::isalnum(static_cast<unsigned char>(ch)))
          re += ch;
        else
          re += std::string("\\") + ch;
      }
      const std::regex matcher(re);
      for (const auto& f : found) {
        std::error_code ec;
        for (const auto& entry : fs::directory_iterator(f, ec))
          if (entry.is_directory(ec) && std::regex_match(entry.path().filename().string(), matcher))
            next.push_back(entry.path());
      }
    }
    found = std::move(next);
  }
  return found;
}

}  // namespace

std::vector<fs::path> EarlierRuns::find() const {
  return pattern_.empty() ? std::vector<fs::path>{} : matching_folders(pattern_);
}

EarlierRuns RunDirectory::earlier_runs(const Config& config, const std::string& name) {
  std::string pattern;
  try {
    pattern = expand_fields(config.get_string("logging.run_dir"),
                            {{"name", name},
                             {"timestamp", std::string(1, kAnyTimestamp)},
                             {"hash", run_dir_hash(config)}});
  } catch (const Error& e) {
    throw config.error_at("logging.run_dir", e.what());
  }
  return EarlierRuns(absolute_from_working_directory(pattern + kAnySuffix));
}

}  // namespace fabric
