// The sweep state file, <sweep dir>/sweep_state.json: what happened to each run, so that running
// the same sweep again skips finished runs and retries failed or interrupted ones. Written
// atomically after every change; a sweep killed with SIGKILL leaves runs marked "running", which
// the next invocation treats as interrupted. Runs handed to SLURM (--launcher=slurm) stay
// "submitted" until an invocation sees how their array element ended (tools/sweep/slurm.h).
#ifndef TOOLS_SWEEP_STATE_H_
#define TOOLS_SWEEP_STATE_H_

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fabric::sweep {

// kDiverged: the program stopped on non-finite values (exit status 3, trainer.stop_on_nonfinite):
// a result like kDone (never retried; ranked after the runs that finished), not a failure.
// kPruned: the sweep's pruner stopped the run (SIGTERM; tools/sweep/pruner.h): a result too,
// ranked after the finished runs; under asha it may be promoted later (resumed from its
// checkpoint).
enum class RunStatus {
  kPending,
  kRunning,
  kSubmitted,
  kDone,
  kDiverged,
  kFailed,
  kInterrupted,
  kPruned
};

std::string to_string(RunStatus status);
// Done, diverged or pruned: the run has its result and is not run again (an asha promotion aside).
inline bool has_result(RunStatus status) {
  return status == RunStatus::kDone || status == RunStatus::kDiverged ||
         status == RunStatus::kPruned;
}
// The exit status of a Fabric program that stopped on non-finite values (trainer.stop_on_nonfinite;
// examples/common/classification.cc).
constexpr int kDivergedExitStatus = 3;

struct RunRecord {
  RunStatus status = RunStatus::kPending;
  int exit_code = 0;   // exit status, or 128 + signal
  std::string reason;  // failures: "exit 1: error: ..." (the log's last line), "killed by ..."
  int attempts = 0;
  double wall_seconds = 0;  // of the last attempt
  std::string run_dir;      // the attempt's run directory (the one holding summary.json)
  std::string log;          // log file of the last attempt
  nlohmann::json summary;   // the run's summary.json (done runs)
  std::string
      slurm_job;  // "JOB_TASK": the SLURM array element of the last attempt (--launcher=slurm)
  // With a pruner: the run's reports of the pruner's metric, resource (step or epoch) → value, from
  // its metrics.csv; and under asha the highest rung it was judged at (-1: none yet).
  std::map<double, double> reports;
  int rung = -1;
  // search: optuna: the run's trial number in the study and its values (key, value text), so that
  // a re-run rebuilds the run (-1: not a trial).
  int64_t trial = -1;
  std::vector<std::pair<std::string, std::string>> values;
  // The last attempt's command line without argv[0], and the hash of its --config file's text
  // (tools/sweep/changes.h check_changed_runs); empty in state files written before they were kept.
  std::vector<std::string> command;
  std::string config_hash;
};

class SweepState {
 public:
  // Reads `path` when it exists (runs left "running" become interrupted). Throws fabric::Error
  // naming the file when it exists but cannot be parsed (the fix: move it away).
  static SweepState load(const std::filesystem::path& path);

  RunRecord& operator[](const std::string& run_id) { return runs_[run_id]; }
  const std::map<std::string, RunRecord>& runs() const { return runs_; }
  // Atomically rewrites the file. Throws fabric::Error.
  void save() const;

 private:
  std::filesystem::path path_;
  std::map<std::string, RunRecord> runs_;
};

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_STATE_H_
