// fabric::StopSignal: a clean stop on SIGTERM (a sweep's pruner, a cluster scheduler's preemption,
// `kill PID`), so that the work done so far is kept.
//
// While a StopSignal exists, SIGTERM no longer ends the process: it sets a flag that requested()
// reports, on every rank at the same step; the training loop then saves a checkpoint and exits
// with status 143 (128 + SIGTERM), which `checkpoint.resume=auto` continues from. The examples
// (examples/common/classification.cc) do this. The destructor puts the previous handler back.
// Only one may exist at a time. SIGKILL still ends the process at once: the sweep and the
// launchers send it when a stopped program has not ended within their grace period.
//
// Cost: on one process, reading an atomic flag per step; with several ranks, every `every` steps
// one all-reduce of one number (the examples pass logging.log_every_n_steps, where they already
// synchronize), so the stop comes at most `every` steps after the signal.
//
//   fabric::StopSignal stop(f, log_every);
//   for (...) { ...; ++step; if (stop.requested(step)) { checkpoints.save(); return 143; } }
#ifndef FABRIC_STOP_SIGNAL_H_
#define FABRIC_STOP_SIGNAL_H_

#include <signal.h>

#include <cstdint>

#include "fabric/fabric.h"

namespace fabric {

class StopSignal {
 public:
  // Installs the SIGTERM handler. Throws fabric::Error when another StopSignal exists or `every`
  // is below 1.
  StopSignal(Fabric& f, int64_t every);
  ~StopSignal();
  StopSignal(const StopSignal&) = delete;
  StopSignal& operator=(const StopSignal&) = delete;

  // Whether some rank got SIGTERM. Collective every `every` steps when the world has several
  // ranks: every rank must call it after every step with the same `step`; then true on every rank
  // at the same step.
  bool requested(int64_t step);

  // The exit status of a program that stopped on it: 143.
  static constexpr int kExitStatus = 128 + SIGTERM;

 private:
  Fabric& f_;
  int64_t every_;
  struct sigaction previous_ {};
};

}  // namespace fabric

#endif  // FABRIC_STOP_SIGNAL_H_
