// The results of a sweep: results.csv (one row per run) and a Markdown table (one row per point
// of the sweep, seeds aggregated as mean ± sample standard deviation, sorted by the metric).
#ifndef TOOLS_SWEEP_REPORT_H_
#define TOOLS_SWEEP_REPORT_H_

#include <filesystem>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

// Columns: run, status, exit_code, attempts, the swept keys (full names), seed, every numeric
// field of the runs' summary.json (the metric first, then in order of appearance), wall_time_s,
// run_dir, reason. Runs never started are left out.
std::string results_csv(const SweepSpec& spec, const std::map<std::string, RunRecord>& records);

struct Stats {
  int n = 0;
  double mean = 0, std = 0;  // sample standard deviation (n - 1); 0 for n < 2
};
Stats stats_of(const std::vector<double>& values);

// | rank | <swept keys> | <metric> (mean ± std) | seeds done | wall s |: best first (mode);
// points with a failed, diverged, pruned or not yet run run after those whose runs all finished
// (their runs column says "1/2", "1/2, 1 diverged" or "0/1, 1 pruned"), points without a result
// last.
std::string results_markdown(const SweepSpec& spec,
                             const std::map<std::string, RunRecord>& records);

// best.yaml: the resolved config.yaml of the best run of the first-ranked point, without
// logging.run_dir and checkpoint.resume, under a comment naming the run, its metric and the
// command that re-runs it (`--config=` the absolute path `best_yaml`, where it is written).
// nullopt when that point does not have all its runs finished with the metric (a failed,
// diverged, pruned or not yet run run).
// Throws fabric::Error when the run's config.yaml cannot be read.
struct BestConfig {
  std::string run_id;
  std::string yaml;
};
std::optional<BestConfig> best_config(const SweepSpec& spec,
                                      const std::map<std::string, RunRecord>& records,
                                      const std::filesystem::path& best_yaml);

// Writes results.csv, results.md and best.yaml to `sweep_dir`, prints the table, the failed runs
// and where the files are. Returns the sweep's exit status: `run_code` when non-zero (a signal), 1
// when a run of the spec failed, else 0 (diverged runs are results: they do not make it 1).
int write_report(const SweepSpec& spec, SweepState& state, const std::filesystem::path& sweep_dir,
                 int run_code, std::ostream& out);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_REPORT_H_
