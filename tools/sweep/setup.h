// Everything the sweep checks and decides before the first run starts.
#ifndef TOOLS_SWEEP_SETUP_H_
#define TOOLS_SWEEP_SETUP_H_

#include <filesystem>
#include <map>
#include <ostream>
#include <string>

#include "tools/sweep/runner.h"
#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

struct Setup {
  RunnerOptions options;
  // The program's resolved config with the base config and common overrides (from
  // --print_config): dotted key → YAML text.
  std::map<std::string, std::string> resolved;
};

// Finds the program (a label: in the runfiles of //tools:sweep; a path: relative to the working
// directory, else to the sweep file) and the base config (next to the sweep file, else where the
// program looks: working directory, configs/), runs `program --print_config` once, and checks that
// every swept key and the seed key exist (did-you-mean at the sweep file's line) and that the
// program has logging.run_dir. Adds checkpoint.resume=auto when the program has it and
// resume_runs is true. Throws ConfigError.
Setup prepare(const SweepSpec& spec, const std::filesystem::path& sweep_file,
              RunnerOptions options);

// Sets options.parallel (options.parallel > 0 means --parallel was given), the GPU slots
// (CUDA_VISIBLE_DEVICES, else /dev/nvidiaN; none when the runs use fabric.accelerator: cpu) and
// the CPU threads per run. Prints a note when parallel is capped by the GPUs.
void plan_devices(const SweepSpec& spec, const Setup& setup, RunnerOptions& options,
                  std::ostream& out);

// The runs whose configs stand for all of `runs`: the first of each distinct set of swept keys,
// each run bringing a (key, value) not seen before for values that are not real numbers (choices,
// integers, strings: every one checked), and for real numbers (with a '.' or an exponent: learning
// rates, dropouts) the runs holding each key's smallest and largest value (schema checks are
// ranges). A random search of 1000 trials over real values checks a handful, not 1000.
std::vector<const SweepRun*> runs_to_check(const std::vector<const SweepRun*>& runs);

// Checks the runs that are not done (runs_to_check of them) with `program ... --print_config`.
// Throws ConfigError
// "FILE:LINE:COL: KEY: problem (run ID)" pointing at the value in the sweep file.
// With more than 20 runs to check, says so on `progress` first and then every 5 seconds.
void preflight(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
               std::ostream* progress = nullptr);

// The visible GPUs: CUDA_VISIBLE_DEVICES entries when set, else /dev/nvidia0, /dev/nvidia1, ...
std::vector<std::string> visible_gpus();

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_SETUP_H_
