// Early stopping of sweep runs that fall behind (`pruner:` in a sweep file,
// tools/sweep/spec.h).
//
// While runs train, the sweep reads each running run's metrics.csv (fabric/logging/metrics_csv.h)
// a few times a second; every row with a value of pruner.metric is a report at a resource (the
// row's step, or its epoch with min_epochs). The reports are kept in the sweep state, so later
// runs and later invocations compare against them. A run the pruner stops gets SIGTERM (a Fabric
// example saves a checkpoint and exits, docs/experiments.md) and the status `pruned`: a result,
// ranked after the finished runs, never retried.
//
//   median  As Optuna's MedianPruner: at each report at resource t >= min, the run's best value so
//           far is compared with the median of the values at t of the finished (done) runs that
//           reported at t; worse than the median (strictly) stops it. No decision at t while fewer
//           than min_runs finished runs reported there (Optuna's n_startup_trials).
//   asha    Asynchronous successive halving (Li et al., "A System for Massively Parallel
//           Hyperparameter Tuning", MLSys 2020), stopping at rungs as Optuna's
//           SuccessiveHalvingPruner does: rung k sits at resource min·η^k (η = reduction_factor).
//           A run's value at rung k is its first report at or past the rung. When a run reaches a
//           rung it goes on if its value is among the top max(1, ⌊n/η⌋) of the n runs judged at
//           that rung so far (itself included), and is stopped otherwise. A stopped run is
//           promoted, as the paper's algorithm does, once enough later runs were judged at its
//           rung that it is in their top ⌊n/η⌋: when a slot is free the sweep resumes it (from its
//           checkpoint, with resume_runs) before starting a new run.
#ifndef TOOLS_SWEEP_PRUNER_H_
#define TOOLS_SWEEP_PRUNER_H_

#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

// The reports in a metrics.csv: resource → value of `spec.metric` (rows without a value, or
// with a non-finite one, are left out; a later row at the same resource replaces an earlier one).
// Empty when the file is missing or has no such column. Never throws. `columns`, when given,
// receives the file's header (empty for a missing or empty file).
std::map<double, double> read_reports(const std::filesystem::path& metrics_csv,
                                      const PrunerSpec& spec,
                                      std::vector<std::string>* columns = nullptr);

// The decision for run `id` after its reports in `records` grew: the reason it must stop
// ("test/accuracy 0.41 at step 2 is not in the top 1 of the 5 runs at rung 0 (step 2)"), or
// nullopt to go on. Under asha `*rung` is the run's rung (records[id].rung) and comes back as the
// highest rung it was judged at, passed or stopped at.
std::optional<std::string> decide(const PrunerSpec& spec, const std::string& id,
                                  const std::map<std::string, RunRecord>& records, int* rung);

// asha: the highest rung at or below `resource` (-1: before the first).
int rung_at(const PrunerSpec& spec, double resource);

// asha: the pruned runs that are now in the top ⌊n/η⌋ of the rung they were stopped at, best
// first (empty for median, which never promotes).
std::vector<std::string> promotable(const PrunerSpec& spec,
                                    const std::map<std::string, RunRecord>& records);

// The pruner's side of a running sweep (run_pending, tools/sweep/runner.h): reads each
// running run's metrics.csv into its reports in the state, judges it, and keeps the asha rungs of
// the runs that end.
class PruneWatch {
 public:
  // Decides instead of the spec's own rules (search: optuna: Optuna's pruners); no promotions.
  using Decider = std::function<std::optional<std::string>(const SweepRun&, const RunRecord&)>;
  PruneWatch(const PrunerSpec& spec, SweepState& state, Decider external)
      : spec_(spec), state_(state), external_(std::move(external)) {}
  bool active() const { return !spec_.type.empty(); }

  // Merges the rows of `metrics_csv` (the run's current attempt) into its reports; true when they
  // changed. The file is parsed only when its modification time or size moved since the last read.
  bool read(const SweepRun& run, const std::filesystem::path& metrics_csv);
  // For a running run whose reports changed: the reason to stop it, or nullopt.
  std::optional<std::string> verdict(const SweepRun& run);
  // A run ended with a result: under asha (own rules) the highest rung its reports reached.
  void ended(const SweepRun& run);
  // Once per sweep, when a run ended with a metrics.csv whose header lacks the pruner's metric
  // (or its step/epoch column): the line saying so, with the closest column; nullopt otherwise.
  std::optional<std::string> take_warning();
  // The pruned runs to resume now (asha, own rules), best first.
  std::vector<std::string> promotions() const;

 private:
  const PrunerSpec& spec_;
  SweepState& state_;
  Decider external_;
  std::string warning_;  // not yet taken
  bool warned_ = false;  // a warning was made (once per sweep)
  // run id → its metrics.csv and that file's columns when last parsed.
  std::map<std::string, std::pair<std::filesystem::path, std::vector<std::string>>> columns_;
  // metrics.csv → its (modification time, size) when last parsed.
  std::map<std::filesystem::path, std::pair<std::filesystem::file_time_type, uintmax_t>> read_at_;
};

// "step 2" or "epoch 3".
std::string resource_text(const PrunerSpec& spec, double resource);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_PRUNER_H_
