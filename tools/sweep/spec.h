// A sweep file (`bazel run //tools:sweep -- --sweep=FILE`) and the runs it expands to.
//
//   name: fashion_mnist_lr            # default: the file name without .yaml
//   binary: //examples:fashion_mnist  # a label bundled with //tools:sweep, or a path to a program
//   config: fashion_mnist.yaml        # base config (--config=); optional
//   overrides: {trainer.max_epochs: 1}  # applied to every run; optional
//   grid:                             # every combination of these values
//     optimizer.lr: [0.03, 0.1, 0.3]
//   list:                             # and/or explicit override sets (crossed with the grid)
//     - {model.width: 16}
//     - {model.width: 32, model.hidden: 64}
//   seeds: [1, 2]                     # each point runs once per seed (as fabric.seed); optional
//   parallel: 1                       # runs at once; `auto`: one per GPU (1 without GPUs)
//   devices_per_run: 1                # GPUs handed to each run through CUDA_VISIBLE_DEVICES
//   metric: test_accuracy             # key of each run's summary.json to rank by (required)
//   mode: max                         # max | min (required)
//   dir: sweeps/{name}                # sweep directory, relative to where the command was run
//   workdir: .                        # where runs start, relative to this file's folder (so
//                                     # relative paths in it, its config and overrides mean
//                                     # what they mean when the program is run there)
//   seed_key: fabric.seed             # the config key the seeds go to
//   resume_runs: true                 # a retried run resumes from its checkpoint (resume: auto)
//   search: grid                      # grid | random | optuna (tools/sweep/optuna.h)
//   trials: 8                         # search: random: how many points to draw
//   random_seed: 0                    # search: random: which points (same seed, same points)
//   space:                            # search: random: a distribution per key
//     optimizer.lr: {loguniform: [0.001, 1]}   # also uniform: [low, high], int: [low, high]
//     model.width: [16, 32, 64]                 # a list: a choice (also {choice: [...]})
//   sampler: TPESampler               # search: optuna: any of optuna.samplers by name
//   storage: sqlite:///path/optuna.db # search: optuna: default <sweep dir>/optuna.db
//   study: NAME                       # search: optuna: default the sweep's name
//   pruner:                           # optional: stop runs that fall behind (sweep_pruner.h;
//                                     # under search: optuna, Optuna's pruners decide)
//     type: asha                      # median | asha
//     metric: test/accuracy           # a metrics.csv column (required)
//     mode: max                       # default: the sweep's mode
//     min_steps: 100                  # or min_epochs: 1 (the resource axis: metrics.csv's step or
//                                     # epoch column); no decision before it; asha's first rung
//     reduction_factor: 3             # asha: rung k at min·factor^k; the top 1/factor go on
//     min_runs: 3                     # median: finished runs at a step before it decides there
//
// Every problem is one ConfigError line "FILE:LINE:COL: KEY: problem; fix".
#ifndef TOOLS_SWEEP_SPEC_H_
#define TOOLS_SWEEP_SPEC_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tools/sweep/space.h"

namespace fabric::sweep {

// key → YAML value text ("0.1", "[0.9, 0.99]"), in sweep-file order.
using Overrides = std::vector<std::pair<std::string, std::string>>;

struct SweepRun {
  // Directory name under <sweep dir>/runs, from the swept values: "lr=0.1_seed=1". Stable when
  // the sweep file changes; a hash suffix keeps it unique and at most ~100 characters.
  std::string id;
  Overrides overrides;  // grid and list values of this run (not the common overrides, not the seed)
  std::vector<std::string> value_origin;  // FILE:LINE:COL of each of `overrides`
  std::optional<int64_t> seed;
  std::string origin;  // "FILE:LINE:COL" of the run's first swept value (for error messages)
  // Every override the program gets, in order: common, swept, seed.
  std::vector<std::string> arguments(const Overrides& common, const std::string& seed_key) const;
};

// The `pruner:` section (tools/sweep/pruner.h).
struct PrunerSpec {
  std::string type;    // "" (none) | median | asha
  std::string metric;  // metrics.csv column
  bool maximize = true;
  bool by_epoch = false;  // the resource: metrics.csv's epoch column (min_epochs) or step
  double min_resource = 1;
  int reduction_factor = 3;
  int min_runs = 3;
  std::string origin;  // FILE:LINE:COL of `pruner:`
};

struct SweepSpec {
  std::string file;  // as given, for messages
  std::string name;
  std::string binary;       // label "//pkg:name" or a path, as written
  std::string binary_mark;  // FILE:LINE:COL of `binary:`
  std::string config;       // as written ("" = none)
  Overrides common;
  std::vector<std::string> swept_keys;            // grid and list keys, first appearance order
  std::map<std::string, std::string> key_origin;  // FILE:LINE:COL of each key (common and swept)
  std::vector<int64_t> seeds;
  std::optional<int> parallel;  // nullopt = auto
  int devices_per_run = 1;
  std::string metric;
  bool maximize = true;
  std::string dir;            // as written, {name} expanded
  std::string dir_mark;       // "FILE:LINE:COL" of dir:, "" when absent
  std::string workdir = ".";  // relative to the sweep file's folder
  std::string workdir_mark;   // "FILE:LINE:COL" of workdir:, "" when absent
  std::string seed_key = "fabric.seed";
  bool resume_runs = true;
  std::string search = "grid";  // grid | random | optuna
  int64_t trials = 0;           // search: random, optuna
  uint64_t random_seed = 0;     // search: random; optuna: the sampler's seed
  std::string search_origin;    // FILE:LINE:COL of `search:`
  // search: optuna: the space (also parsed for random, whose runs are drawn at parse time), the
  // sampler's name, the storage URL ("" = <sweep dir>/optuna.db) and the study name.
  std::vector<std::pair<std::string, Distribution>> space;
  std::string sampler = "TPESampler", storage, study;
  std::string storage_mark;  // "FILE:LINE:COL" of storage:, "" when absent
  PrunerSpec pruner;
  // The expansion, in order: list entry, then grid (last key fastest). search: optuna: empty at
  // parse time; the sweep adds a run per trial as it asks Optuna (sweep_optuna.h).
  std::vector<SweepRun> runs;
};

// Parses and checks `yaml` (the contents of `file`). Throws fabric::ConfigError.
SweepSpec parse_sweep(const std::string& yaml, const std::string& file);
// Reads `path` then parse_sweep. Throws ConfigError when it cannot be read.
SweepSpec load_sweep(const std::string& path);

// The id of a run with these swept values (and seed): "lr=0.1_width=16_seed=2", the keys by their
// short names, every part reduced to [A-Za-z0-9.+-]. `prefix` goes first ("t3_").
std::string point_id(const std::vector<std::string>& keys, const Overrides& values,
                     std::optional<int64_t> seed, const std::string& prefix = "");

// The short column name of each swept key: its last component ("lr"), or the whole key when two
// keys share a last component.
std::map<std::string, std::string> short_names(const std::vector<std::string>& keys);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_SPEC_H_
