// Runs the pending runs of a sweep as child processes, `parallel` at a time, and keeps the state
// file up to date.
//
// Each run is `BINARY [--config=CONFIG] <overrides> <swept values> <seed> logging.run_dir="<sweep
// dir>/runs/<id>" [checkpoint.resume=auto]` (the run directory a YAML double-quoted string, so a
// path with " #", ": " or quotes stays one value), started in the directory the sweep was started
// from, in its own process group, with stdout and stderr appended to <sweep dir>/logs/<id>.log.
// With GPUs, each run gets its own `devices_per_run` of them through CUDA_VISIBLE_DEVICES; without,
// parallel runs share the cores (FABRIC_CPUS = CPUs / parallel for each run, whose ranks split it
// again; not when OMP_NUM_THREADS is set).
//
// A run is done when it exits 0 and wrote summary.json; anything else is a failure, recorded with
// the reason (the last line of its log), and the sweep goes on; a failed attempt's run folder
// without a checkpoint is renamed runs/<id>.failed-<attempt> (so the retry writes runs/<id>). A
// folder under runs/ belongs to the longest run id it is a run directory (<id> or <id>-N) of: runs
// "resnet" and "resnet-50" never touch each other's folders. Each run's command line (without
// the program and logging.run_dir) and a hash of the --config file are kept in the state
// (tools/sweep/changes.h). SIGINT/SIGTERM/SIGHUP stop the
// sweep: running runs get SIGTERM (SIGKILL after 10 s), are marked interrupted, and are retried
// (resuming from their checkpoints) by the next invocation. Runs die with the sweep
// (PR_SET_PDEATHSIG), also when it is SIGKILLed.
//
// With a pruner (spec.pruner, tools/sweep/pruner.h) the running runs' metrics.csv files are
// read ten times a second; a run the pruner stops gets SIGTERM (SIGKILL after 10 s) and ends as
// pruned, and under asha a free slot first resumes a stopped run that is now promotable.
#ifndef TOOLS_SWEEP_RUNNER_H_
#define TOOLS_SWEEP_RUNNER_H_

#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tools/sweep/process.h"
#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

struct RunnerOptions {
  std::filesystem::path binary;     // absolute path of the program
  std::filesystem::path sweep_dir;  // absolute
  std::filesystem::path cwd;        // where runs start
  std::string config;               // --config= value ("" = none)
  std::string config_hash;          // config_text_hash(config), recorded with each run
  std::vector<std::string> extra;   // overrides added to every run (e.g. checkpoint.resume=auto)
  int parallel = 1;
  std::vector<std::string> gpu_slots;  // CUDA_VISIBLE_DEVICES value per slot; empty: no GPUs
  int64_t cpus_per_run = 0;            // FABRIC_CPUS for each run; 0: leave alone
  int max_runs = 0;                    // start at most this many runs; 0: all pending
  // search: optuna: when a slot is free and no run is pending, a new run (nullptr: no more), and
  // how many such runs may still come (for the [k/n] count).
  std::function<const SweepRun*()> next_run;
  int more_runs = 0;
  // With a pruner: decides instead of the sweep's own pruner (search: optuna: Optuna's pruners):
  // the reason to stop the run, or nullopt. No asha promotions then.
  std::function<std::optional<std::string>(const SweepRun&, const RunRecord&)> external_pruner;
  // Called when a run ends with a result (done, diverged, pruned); e.g. to tell Optuna.
  std::function<void(const SweepRun&, const RunRecord&)> on_result;
};

// `text` in double quotes, backslashes and '"' escaped by a backslash: what a YAML double-quoted
// scalar and an #SBATCH line both read back as exactly `text` (a path with " #", ": " or quotes).
std::string double_quoted(const std::string& text);

// The full command line of `run` (argv[0] = binary).
std::vector<std::string> run_command_line(const SweepSpec& spec, const SweepRun& run,
                                          const RunnerOptions& options);

// Runs every run of `spec` not yet done in `state`. Returns 0 when all finished, 128 + signal
// when interrupted by one, 1 when options.next_run threw (a failed Optuna ask: the running runs
// finish, none starts after it); failed runs are in `state` (the caller reports them).
int run_pending(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
                std::ostream& out);

// Records how an attempt of `run` ended in `rec` (whose `log` is the attempt's log): done when
// `exit_code` is 0 and runs/<id> (or runs/<id>-N) holds a summary.json written since `since`
// (diverged when its metric is null: NaN or infinite); failed otherwise, the reason `how` ("exit
// 1", "killed by signal 9") and the program's last output line (none when it printed nothing).
// Returns the console line: "done ID in 1.2 s: METRIC VALUE" or "FAILED ID in ...: REASON (log:
// ..)".
std::string record_exit(const SweepSpec& spec, const SweepRun& run, int exit_code,
                        const std::string& how, double wall_seconds,
                        std::filesystem::file_time_type since, const std::filesystem::path& runs,
                        RunRecord& rec);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_RUNNER_H_
