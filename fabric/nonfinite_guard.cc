#include "fabric/nonfinite_guard.h"

#include <vector>

namespace fabric {

NonFiniteGuard::NonFiniteGuard(Fabric& f)
    : NonFiniteGuard(f, f.config().get_int("trainer.stop_on_nonfinite")) {}

NonFiniteGuard::NonFiniteGuard(Fabric& f, int64_t limit) : f_(f), limit_(limit) {
  if (limit_ < 0) throw Error("NonFiniteGuard: limit " + std::to_string(limit_) + " is negative");
  const auto options = torch::dtype(torch::kLong).device(f.device());
  run_ = torch::zeros({}, options);
  peak_ = torch::zeros({}, options);
}

bool NonFiniteGuard::update(const torch::Tensor& loss, int64_t step) {
  if (limit_ == 0) return false;
  torch::NoGradGuard no_grad;
  const auto bad = torch::logical_not(torch::isfinite(loss.detach()).all()).to(torch::kLong);
  run_.add_(1).mul_(bad);
  torch::maximum_out(peak_, peak_, run_);
  if (step % limit_ != 0) return false;
  // One copy to the host for all ranks' values (not one synchronization per rank).
  const torch::Tensor peaks = torch::cat(f_.all_gather(peak_.reshape({1}))).cpu();
  const auto values = peaks.accessor<int64_t, 1>();
  std::vector<int64_t> ranks;
  for (int64_t r = 0; r < values.size(0); ++r)
    if (values[r] >= limit_) ranks.push_back(r);
  peak_.copy_(run_);
  if (ranks.empty()) return false;
  std::string names;
  for (int64_t r : ranks) names += (names.empty() ? "" : ", ") + std::to_string(r);
  message_ = "the loss was not finite for " + std::to_string(limit_) +
             " consecutive steps on rank" + (ranks.size() > 1 ? "s " : " ") + names +
             " (detected at step " + std::to_string(step) +
             "; trainer.stop_on_nonfinite: " + std::to_string(limit_) + ")";
  return true;
}

}  // namespace fabric
