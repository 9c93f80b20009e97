// fabric::NonFiniteGuard: stops a diverged run on every rank at the same step.
//
// `trainer.stop_on_nonfinite: K` (default 10; 0: off): once some rank has seen K consecutive
// non-finite (NaN or ±inf) losses, update() returns true on every rank at the same step, and
// message() names the ranks. Steps that 16-mixed's GradScaler skips because of overflowing
// gradients (with a finite loss) are not counted here: they are the scaler's normal operation
// (summary.json's skipped_steps counts them).
//
// Cost: three tiny device ops per step and no host synchronization; every K steps one all_gather
// of a single integer (so detection comes at most K steps after the K-th bad loss).
//
//   fabric::NonFiniteGuard guard(f);
//   for (...) { ...; f.step(*optimizer); ++step;
//               if (guard.update(loss, step)) { f.print(guard.message()); /* save, stop */ } }
#ifndef FABRIC_NONFINITE_GUARD_H_
#define FABRIC_NONFINITE_GUARD_H_

#include <cstdint>
#include <string>

#include "fabric/fabric.h"

namespace fabric {

class NonFiniteGuard {
 public:
  // K from trainer.stop_on_nonfinite.
  explicit NonFiniteGuard(Fabric& f);
  NonFiniteGuard(Fabric& f, int64_t limit);

  // Counts this step's `loss` (any shape: non-finite if any element is). Collective every
  // `limit` steps: every rank must call it after every step with the same `step`. True when
  // training must stop (then on every rank).
  bool update(const torch::Tensor& loss, int64_t step);
  // "the loss was not finite for 10 consecutive steps on rank 1 (detected at step 440;
  // trainer.stop_on_nonfinite: 10)".
  const std::string& message() const { return message_; }
  int64_t limit() const { return limit_; }

 private:
  Fabric& f_;
  int64_t limit_;
  torch::Tensor run_, peak_;  // this rank's current and longest run of non-finite losses
  std::string message_;
};

}  // namespace fabric

#endif  // FABRIC_NONFINITE_GUARD_H_
