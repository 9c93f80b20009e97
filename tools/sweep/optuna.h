// search: optuna (tools/sweep/spec.h): Optuna chooses the trials and keeps the study.
//
// The sweep talks to Optuna through tools/sweep/optuna_bridge.py (bundled with //tools:sweep; run
// with $PYTHON, default python3), one short process per call: `check` once at the start, `ask`
// when a slot is free and fewer than `trials` runs exist (so the sampler has every result told
// so far), `tell` when a run ends with a result: done → its metric; diverged → FAIL; pruned →
// PRUNED. A failed or interrupted run is not told: its trial stays RUNNING in the study and the
// next invocation runs it again with the same values. The study lives in `storage:` (default
// sqlite:///<sweep dir>/optuna.db; a database URL for several machines sharing one study) under
// `study:` (default the sweep's name), so `optuna-dashboard sqlite:///<sweep dir>/optuna.db` shows
// it and running the same sweep again continues it. Each trial is a run with id
// t<number>_<key>=<value>..., its values written as random search writes them (four significant
// digits for uniform and loguniform; Optuna keeps its unrounded value); sweep_state.json keeps
// each run's trial number and values.
#ifndef TOOLS_SWEEP_OPTUNA_H_
#define TOOLS_SWEEP_OPTUNA_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>
#include <utility>

#include "tools/sweep/runner.h"
#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

class OptunaStudy {
 public:
  // Finds the bridge and checks that optuna imports and spec.sampler is one of its samplers.
  // Throws ConfigError "FILE:LINE:COL: search: optuna: ..." with the bridge's one line.
  OptunaStudy(const SweepSpec& spec, const std::filesystem::path& sweep_dir);

  // A new trial: its number and values (value texts, in the order of spec.space). Throws
  // fabric::Error naming the bridge's message.
  std::pair<int64_t, Overrides> ask() const;
  // Tells the study how trial `number` ended: `value`, or state "pruned" / "fail".
  void tell(int64_t number, double value) const;
  void tell(int64_t number, const std::string& state) const;
  // With a pruner: reports the trial's `reports` (resource → value) as its intermediate values and
  // returns whether Optuna's pruner of that type (MedianPruner, SuccessiveHalvingPruner, set up
  // from `pruner`) says to stop it.
  bool report(int64_t number, const std::map<double, double>& reports,
              const PrunerSpec& pruner) const;

  const std::string& storage() const { return storage_; }

 private:
  std::string run(const std::vector<std::string>& args) const;  // the bridge's stdout

  const SweepSpec& spec_;
  std::filesystem::path bridge_;
  std::string python_, storage_;
};

// The run of trial `number` with `values` (id t<number>_...).
SweepRun trial_run(const SweepSpec& spec, int64_t number, const Overrides& values);

// Adds the runs of the trials recorded in `state` to spec.runs, by trial number, after reserving
// room for spec.trials runs (pointers to them stay valid while the sweep adds more).
void add_recorded_trials(SweepSpec& spec, SweepState& state);

// Prepares a search: optuna sweep for run_pending: the runs of the trials recorded in `state`
// (add_recorded_trials), the keys checked once with probe_run, and the runner's hooks:
// options.next_run asks `study` for a trial, on_result tells it how a run ended (its reports
// first, with a pruner), and with a pruner external_pruner asks Optuna's. `study`, `spec` and
// `state` must outlive the run; warnings (a failed tell) go to `out`. Throws ConfigError.
void connect(const OptunaStudy& study, SweepSpec& spec, SweepState& state, RunnerOptions& options,
             std::ostream& out);

// A run with each key's first value (low end, first choice), or with `high` its last (high end,
// last choice), for checking the keys and both ends of their ranges before any trial is asked.
SweepRun probe_run(const SweepSpec& spec, bool high = false);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_OPTUNA_H_
