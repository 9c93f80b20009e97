// bazel run //tools:sweep -- --sweep=FILE [--dir=DIR] [--parallel=N] [--max_runs=N] [--dry_run]
//                             [--rerun_changed] [--launcher=local|slurm [--sbatch="ARGS"]
//                             [--no_wait]]
//
// Runs a config sweep (file format: tools/sweep/spec.h) and writes, in the sweep directory
// (default sweeps/<name>, relative to where the command was run): runs/<id>/ (each run's run
// directory), logs/<id>.log, sweep_state.json, results.csv, results.md (also printed) and
// best.yaml (the best run's config); with search: optuna also optuna.db (the study, unless the
// sweep file names another storage:; tools/sweep/optuna.h).
//
// Before anything runs, every pending run's command line is checked with the program's
// --print_config: a bad key or value stops the sweep with one line naming the sweep file's line.
// Running the same command again skips finished runs and retries failed and interrupted ones
// (resuming from their checkpoints when the program has checkpoint.resume). Each run's command line
// and a hash of its --config file are kept in sweep_state.json: when the sweep file (or the config)
// changed what a finished run would get, the sweep refuses to start with one line naming the run
// and the first differing argument (--rerun_changed runs those runs again; --dir= keeps both).
//
// Flags:
//   --sweep=FILE    the sweep file: absolute, relative to the working directory, or in
//                   configs/sweeps/ (e.g. --sweep=fashion_mnist_lr.yaml)
//   --dir=DIR       sweep directory instead of the file's dir: (default sweeps/{name})
//   --parallel=N    runs at once instead of the file's parallel:
//   --max_runs=N    start at most N pending runs in this invocation (0: all)
//   --dry_run       check everything and print the commands (SLURM: the array script); run nothing
//   --rerun_changed run again the finished runs whose command line or config file changed since
//                   they ran (without it such a sweep is refused before anything runs)
//   --launcher=L    local (default): runs are child processes of the sweep; slurm: the pending
//                   runs are submitted as one SLURM job array (tools/sweep/slurm.h), parallel
//                   becomes the array's %N limit (auto: none)
//   --sbatch="ARGS" extra sbatch arguments, split on spaces
//                   (e.g. "--partition=gpu --time=2:00:00");
//                   sbatch's SBATCH_* environment variables work too
//   --no_wait       SLURM: return once the array is submitted; the next invocation gathers it
// Exit status: 0 every run has a result (done, diverged or pruned); 1 some run failed (the others
//              ran; see results.md) or an error; 2 bad sweep file, flag or run config; 128+S
//              stopped by signal S (re-run continues).
#include <sys/file.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>

#include "fabric/core/error.h"
#include "fabric/core/files.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"
#include "tools/sweep/changes.h"
#include "tools/sweep/optuna.h"
#include "tools/sweep/report.h"
#include "tools/sweep/runner.h"
#include "tools/sweep/setup.h"
#include "tools/sweep/slurm.h"
#include "tools/sweep/spec.h"

namespace {

namespace fs = std::filesystem;
using fabric::ConfigError;
using fabric::Error;

constexpr const char* kUsage =
    "usage: sweep --sweep=FILE [--dir=DIR] [--parallel=N] [--max_runs=N] [--dry_run]\n"
    "             [--rerun_changed] [--launcher=local|slurm] [--sbatch=\"ARGS\"] [--no_wait]\n"
    "  Runs a config sweep; see tools/sweep/spec.h and docs/experiments.md.\n"
    "  --rerun_changed  run again the finished runs whose command line or config file changed\n"
    "                   since they ran (without it, such a sweep is refused before anything "
    "runs)\n";

struct Flags {
  std::string sweep, dir, launcher = "local";
  std::vector<std::string> sbatch;
  int parallel = 0, max_runs = 0;
  bool dry_run = false, no_wait = false, sbatch_given = false, rerun_changed = false;
};

int to_int(const std::string& flag, const std::string& text, int min) {
  size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < min)
    throw ConfigError("command line: --" + flag + "=" + text +
                      ": expected an integer >= " + std::to_string(min));
  return v;
}

Flags parse_flags(int argc, char** argv, bool* help) {
  Flags f;
  const std::vector<std::string> names = {
      "--sweep",    "--dir",    "--parallel", "--max_runs",      "--dry_run",
      "--launcher", "--sbatch", "--no_wait",  "--rerun_changed", "--help"};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string name = arg.substr(0, arg.find('='));
    const bool has_value = arg.find('=') != std::string::npos;
    const std::string value = has_value ? arg.substr(arg.find('=') + 1) : "";
    if (name == "--help" || name == "-h") {
      *help = true;
    } else if (name == "--dry_run" && !has_value) {
      f.dry_run = true;
    } else if (name == "--no_wait" && !has_value) {
      f.no_wait = true;
    } else if (name == "--rerun_changed" && !has_value) {
      f.rerun_changed = true;
    } else if (!has_value && (name == "--sweep" || name == "--dir" || name == "--parallel" ||
                              name == "--max_runs" || name == "--launcher" || name == "--sbatch")) {
      throw ConfigError("command line: " + name + " needs a value: " + name + "=VALUE");
    } else if (name == "--sweep") {
      f.sweep = value;
    } else if (name == "--dir") {
      f.dir = value;
    } else if (name == "--parallel") {
      f.parallel = to_int("parallel", value, 1);
    } else if (name == "--max_runs") {
      f.max_runs = to_int("max_runs", value, 0);
    } else if (name == "--launcher") {
      if (value != "local" && value != "slurm")
        throw ConfigError("command line: --launcher=" + value + ": expected local or slurm");
      f.launcher = value;
    } else if (name == "--sbatch") {
      std::istringstream words(value);
      for (std::string w; words >> w;) f.sbatch.push_back(w);
      f.sbatch_given = true;
    } else {
      throw ConfigError("command line: unknown argument '" + arg + "'" +
                        fabric::did_you_mean(name, names) + "; see --help");
    }
  }
  if (f.launcher != "slurm" && (f.no_wait || f.sbatch_given))
    throw ConfigError(std::string("command line: ") + (f.no_wait ? "--no_wait" : "--sbatch") +
                      " is for SLURM sweeps: add --launcher=slurm");
  if (!*help && f.sweep.empty())
    throw ConfigError(
        "command line: --sweep=FILE is required (e.g. --sweep=fashion_mnist_lr.yaml)");
  return f;
}

fs::path find_sweep_file(const std::string& name) {
  for (const auto& c : fabric::search_candidates(name, "configs/sweeps", {}))
    if (fs::is_regular_file(c)) return c;
  throw ConfigError("command line: --sweep=" + name +
                    ": no such file (looked in the working directory and configs/sweeps/)");
}

// Holds an exclusive lock on <dir>/.lock for the life of the process.
void lock_sweep_dir(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw ConfigError("command line: --dir=" + fabric::display_path(dir) +
                      ": cannot be the sweep's "
                      "folder (" +
                      (ec ? ec.message() : std::string("a file is there")) +
                      "); give a folder you can write");
  const fs::path lock = dir / ".lock";
  const int fd = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write " + lock.string() + ": " + std::strerror(errno));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0)
    throw Error("another sweep is running in " + fabric::display_path(dir) +
                " (it holds .lock); wait for it or give this one another --dir");
}

int sweep_main(int argc, char** argv) {
  bool help = false;
  const Flags flags = parse_flags(argc, argv, &help);
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  const fs::path file = find_sweep_file(flags.sweep);
  fabric::sweep::SweepSpec spec = fabric::sweep::load_sweep(fabric::display_path(file));
  fabric::sweep::RunnerOptions options;
  options.sweep_dir =
      fabric::absolute_from_working_directory(flags.dir.empty() ? spec.dir : flags.dir);
  options.max_runs = flags.max_runs;
  // The runs' logging.run_dir is a pattern whose {fields} the program expands (no escape exists).
  if (const std::string d = options.sweep_dir.string(); d.find_first_of("{}") != std::string::npos)
    throw ConfigError(
        (flags.dir.empty() ? (spec.dir_mark.empty() ? spec.file : spec.dir_mark) + ": dir: "
                           : "command line: --dir=" + flags.dir + ": ") +
        "the sweep directory " + d +
        " holds '{' or '}', which the runs' logging.run_dir would read as a {field}; choose a "
        "folder without braces");
  const fabric::sweep::Setup setup = fabric::sweep::prepare(spec, file, options);
  options = setup.options;
  options.config_hash = fabric::sweep::config_text_hash(options.config);
  const bool slurm = flags.launcher == "slurm";
  if (slurm && !spec.pruner.type.empty())
    throw ConfigError(spec.pruner.origin +
                      ": pruner: not available with --launcher=slurm (the "
                      "sweep reads the runs' metrics.csv while they run); run it with the local "
                      "launcher or remove pruner:");
  fabric::sweep::SlurmOptions slurm_options;
  if (slurm) {
    options.parallel = flags.parallel > 0 ? flags.parallel : spec.parallel.value_or(0);
    slurm_options.sbatch_args = flags.sbatch;
    slurm_options.wait = !flags.no_wait;
    auto acc = setup.resolved.find("fabric.accelerator");
    slurm_options.use_gpus = acc != setup.resolved.end() && acc->second == "cuda";
  } else {
    options.parallel = flags.parallel;  // 0: the sweep file's parallel:
    fabric::sweep::plan_devices(spec, setup, options, std::cout);
  }

  // The sweep's own files never replace its inputs (a sweep file called results.md or
  // best.yaml in its own folder).
  for (const char* name :
       {"results.csv", "results.md", "best.yaml", "sweep_state.json", "optuna.db", ".lock"}) {
    try {
      fabric::check_output_path(options.sweep_dir / name, "--dir", {{file, "the sweep file"}});
    } catch (const Error& e) {
      throw ConfigError("command line: --dir=" + fabric::display_path(options.sweep_dir) + ": " +
                        e.what() + " (it writes " + name + " there)");
    }
  }
  if (!flags.dry_run) lock_sweep_dir(options.sweep_dir);
  auto state = fabric::sweep::SweepState::load(options.sweep_dir / "sweep_state.json");
  // Runs an earlier --launcher=slurm invocation submitted: settle the ended ones first.
  std::set<std::string> in_slurm;
  const bool any_submitted =
      std::any_of(spec.runs.begin(), spec.runs.end(), [&](const fabric::sweep::SweepRun& r) {
        return state[r.id].status == fabric::sweep::RunStatus::kSubmitted;
      });
  if (any_submitted && !flags.dry_run)
    in_slurm = fabric::sweep::gather_submitted(spec, state, options, std::cout);
  if (!slurm && !in_slurm.empty()) {
    const std::string& element = state[*in_slurm.begin()].slurm_job;  // "JOB_TASK"
    throw Error(std::to_string(in_slurm.size()) +
                " run(s) of this sweep are still queued or "
                "running in SLURM (job " +
                element.substr(0, element.find('_')) +
                "); wait for them (squeue --me) or cancel them (scancel), or go on with "
                "--launcher=slurm");
  }
  // search: optuna: the trials asked earlier are runs again; new ones are asked as slots free up.
  std::optional<fabric::sweep::OptunaStudy> optuna;
  if (spec.search == "optuna") {
    if (slurm)
      throw ConfigError(spec.search_origin +
                        ": search: optuna: not available with "
                        "--launcher=slurm yet (trials are asked one by one as runs end)");
    optuna.emplace(spec, options.sweep_dir);
    fabric::sweep::connect(*optuna, spec, state, options, std::cout);
  }
  // A finished run whose command line changed (an edited overrides:, config file) is not reused.
  if (const auto changed =
          fabric::sweep::check_changed_runs(spec, state, options, flags.rerun_changed);
      !changed.empty()) {
    std::cout << "sweep: " << changed.size()
              << " finished run(s) whose command line or config changed run again "
                 "(--rerun_changed), e.g. "
              << changed.front() << std::endl;
    if (!flags.dry_run) state.save();
  }
  int done = 0;
  for (const auto& run : spec.runs) done += fabric::sweep::has_result(state[run.id].status);
  fabric::sweep::preflight(spec, state, options, &std::cout);
  const size_t runs = optuna ? std::max<size_t>(spec.runs.size(), static_cast<size_t>(spec.trials))
                             : spec.runs.size();
  std::cout << "sweep " << spec.name << ": " << runs << " runs (" << done << " done earlier), "
            << (slurm && options.parallel == 0 ? std::string("parallel: SLURM decides")
                                               : "parallel " + std::to_string(options.parallel))
            << (options.cpus_per_run > 0
                    ? ", " + std::to_string(options.cpus_per_run) + " CPU(s) per run (FABRIC_CPUS)"
                    : std::string())
            << (slurm ? ", SLURM job array" : "")
            << (optuna ? ", Optuna " + spec.sampler + " study " + spec.study + " in " +
                             optuna->storage()
                       : std::string())
            << ", directory " << fabric::display_path(options.sweep_dir) << std::endl;
  if (flags.dry_run) {
    std::vector<const fabric::sweep::SweepRun*> pending;
    for (const auto& run : spec.runs)
      if (!fabric::sweep::has_result(state[run.id].status)) pending.push_back(&run);
    if (slurm && !pending.empty()) {
      std::cout << "sbatch " << fabric::join(flags.sbatch, " ") << (flags.sbatch.empty() ? "" : " ")
                << fabric::display_path(options.sweep_dir / "slurm" / "array.sh") << "\n"
                << fabric::sweep::array_script(spec, pending, options, slurm_options);
      return 0;
    }
    for (const auto* run : pending)
      std::cout << "  " << fabric::join(fabric::sweep::run_command_line(spec, *run, options), " ")
                << "\n";
    if (optuna && options.more_runs > 0)
      std::cout << "  and " << options.more_runs << " trial(s) Optuna will choose\n";
    return 0;
  }
  const int code = slurm ? fabric::sweep::submit_pending(spec, state, options, slurm_options,
                                                         in_slurm, std::cout)
                         : fabric::sweep::run_pending(spec, state, options, std::cout);
  return fabric::sweep::write_report(spec, state, options.sweep_dir, code, std::cout);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return sweep_main(argc, argv);
  } catch (const ConfigError& e) {
    std::cerr << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "error: " << fabric::describe(e) << std::endl;
    return 1;
  }
}
