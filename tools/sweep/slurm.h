// Sweeps on a SLURM cluster (`//tools:sweep --launcher=slurm`): the pending runs go out as one
// job array, one element per run, and their results come back into the same state file, tables
// and run directories as a local sweep's.
//
// The array script, <sweep dir>/slurm/array.sh, is generated per submission: `--array=0-K%P` (P:
// --parallel or the sweep file's parallel:, no limit for `auto`), `--job-name=sweep_<name>`,
// `--chdir=` the directory the sweep was started from, SLURM's own output to
// <sweep dir>/slurm/%A_%a.out, and `--gres=gpu:<devices_per_run>` when the runs ask for
// fabric.accelerator: cuda. Element i runs the i-th run's command line directly (not under srun:
// the run starts its own fabric.devices ranks on the element's node, as a local run does), with
// FABRIC_CPUS set to the element's CPUs (SLURM_CPUS_PER_TASK, else SLURM_CPUS_ON_NODE), output
// appended to logs/<id>.log, and writes slurm/<id>.exit ("CODE START END") when it ends, also when
// SLURM stops it with SIGTERM (time limit, scancel). Extra sbatch arguments (partition, time,
// account) come from --sbatch="..." or sbatch's own SBATCH_* variables.
//
// Waiting (the default), the sweep polls the exit files every second and SLURM (`squeue --me`)
// every few seconds, printing each run's result as it ends, until the array is over; SIGINT,
// SIGTERM or SIGHUP cancel the array (scancel) and mark its unfinished runs interrupted. With
// --no_wait it returns after sbatch; any later invocation gathers what the array left (a run
// still queued or running is not submitted again; one whose element ended without an exit file,
// e.g. its node failed, is failed with that reason) and submits what is left.
#ifndef TOOLS_SWEEP_SLURM_H_
#define TOOLS_SWEEP_SLURM_H_

#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "tools/sweep/runner.h"
#include "tools/sweep/spec.h"
#include "tools/sweep/state.h"

namespace fabric::sweep {

struct SlurmOptions {
  std::vector<std::string> sbatch_args;  // added to sbatch's command line (--sbatch="...")
  bool wait = true;                      // false: --no_wait
  bool use_gpus = false;                 // the runs use fabric.accelerator: cuda
};

// The job array script for `runs` (element i runs runs[i]). `parallel` 0: no limit.
std::string array_script(const SweepSpec& spec, const std::vector<const SweepRun*>& runs,
                         const RunnerOptions& options, const SlurmOptions& slurm);

// Settles every run left "submitted" by an earlier invocation: its exit file decides done or
// failed; without one, a run SLURM still lists stays submitted and is returned, anything else is
// failed ("ended without an exit status"). Throws fabric::Error when squeue cannot be asked.
std::set<std::string> gather_submitted(const SweepSpec& spec, SweepState& state,
                                       const RunnerOptions& options, std::ostream& out);

// Submits the runs neither done nor still in SLURM (at most options.max_runs) as one array and,
// with slurm.wait, follows it to the end. Returns 0, or 128 + the signal that cancelled it.
// Throws fabric::Error when sbatch refuses the job (its message).
int submit_pending(const SweepSpec& spec, SweepState& state, const RunnerOptions& options,
                   const SlurmOptions& slurm, const std::set<std::string>& in_slurm,
                   std::ostream& out);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_SLURM_H_
