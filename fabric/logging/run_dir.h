// fabric::RunDirectory: one folder per run holding the resolved config.yaml and summary.json.
//
// The folder comes from `logging.run_dir` (default "runs/{name}/{timestamp}"), with fields
//   {name}       the program's name (e.g. "fashion_mnist")
//   {timestamp}  local time of creation, YYYYmmdd-HHMMSS
//   {hash}       run_dir_hash(): the config's hash without checkpoint.* and logging.*
// resolved relative to the directory the command was run in. If the folder exists and is not
// empty, "-1", "-2", ... is appended: a run never overwrites another. Only global rank 0 creates
// and writes (others get an object whose writes do nothing). In a multi-process job the other ranks
// log to rank_N.log in it (see the overload taking a rank).
#ifndef FABRIC_LOGGING_RUN_DIR_H_
#define FABRIC_LOGGING_RUN_DIR_H_

#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "fabric/config/config.h"

namespace fabric {

// Where earlier runs of one program put their run directories (RunDirectory::earlier_runs): the
// logging.run_dir pattern, read from the config once; find() looks on disk each time it is called.
class EarlierRuns {
 public:
  EarlierRuns() = default;  // finds nothing
  // The folders the pattern matches now, with any {timestamp} and any "-N" suffix.
  std::vector<std::filesystem::path> find() const;

 private:
  friend class RunDirectory;
  explicit EarlierRuns(std::filesystem::path pattern) : pattern_(std::move(pattern)) {}
  std::filesystem::path pattern_;
};

class RunDirectory {
 public:
  // Creates the folder and writes config.yaml (global rank 0 only). Throws fabric::Error with the
  // path and the OS error when the folder cannot be created.
  static RunDirectory create(const Config& config, const std::string& name, bool is_global_zero);
  // For a job of `world_size` processes: rank 0 creates the folder and `share_from_rank0` (a
  // broadcast of rank 0's string, e.g. Fabric::broadcast) gives every rank its path; ranks other
  // than 0 then write their stdout and stderr to <run dir>/rank_<rank>.log.
  // Fabric::create_run_directory(name) calls this.
  static RunDirectory create(
      const Config& config, const std::string& name, int64_t rank, int64_t world_size,
      const std::function<std::string(const std::string&)>& share_from_rank0);

  // The run directories earlier runs of program `name` may have made: the folders
  // logging.run_dir matches with any {timestamp} and any "-N" suffix ({hash}: this config's).
  // Throws ConfigError at logging.run_dir for a bad pattern.
  static EarlierRuns earlier_runs(const Config& config, const std::string& name);

  const std::filesystem::path& path() const { return path_; }
  // Writes summary.json atomically (temporary file + rename); returns its path.
  std::filesystem::path write_summary(const nlohmann::json& summary) const;

 private:
  RunDirectory(std::filesystem::path path, bool writer) : path_(std::move(path)), writer_(writer) {}
  std::filesystem::path path_;
  bool writer_;
};

// `pattern` with each {field} replaced by its value in `fields`. Throws fabric::Error "unclosed '{'
// in 'PATTERN'" or "unknown field '{x}' in 'PATTERN' (fields: {a}, {b})".
std::string expand_fields(const std::string& pattern,
                          const std::vector<std::pair<std::string, std::string>>& fields);

// "runs/{name}/{timestamp}" → "runs/fashion_mnist/20261121-231500". Unknown fields are errors.
std::string expand_run_dir(const std::string& pattern, const std::string& name,
                           const std::string& timestamp, const std::string& hash);

// The {hash} field: 16 hex digits of the resolved config without checkpoint.* and logging.* (a
// run's bookkeeping), so the same command with checkpoint.resume=auto finds its folder.
std::string run_dir_hash(const Config& config);

}  // namespace fabric

#endif  // FABRIC_LOGGING_RUN_DIR_H_
