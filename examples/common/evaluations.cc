#include "examples/common/evaluations.h"

#include <algorithm>

namespace examples {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

void check_evaluation_keys(const fabric::Config& c, const Evaluations& e) {
  const bool periodic = c.get_int(e.every_key) > 0;
  const std::string fix = " cannot act while " + e.every_key +
                          " is 0 (one evaluation, at the end): set " + e.every_key +
                          "=N to evaluate every N";
  const std::string monitor = c.get_string("callbacks.early_stopping.monitor");
  if (!monitor.empty()) {
    if (!contains(e.metrics, monitor))
      throw c.error_at("callbacks.early_stopping.monitor",
                       "'" + monitor + "' is not a metric this program evaluates (it has " +
                           joined(e.metrics) + ")");
    if (!periodic) throw c.error_at("callbacks.early_stopping.monitor", "early stopping" + fix);
  }
  if (c.get_string("scheduler.name") != "plateau") return;
  const std::string watched = c.get_string("scheduler.monitor");
  if (!contains(e.monitors, watched))
    throw c.error_at("scheduler.monitor", "'" + watched + "' is not reported by this program (" +
                                              "scheduler.name: plateau; it reports " +
                                              joined(e.monitors) + ")");
  if (!periodic) throw c.error_at("scheduler.name", "plateau" + fix);
}

PlateauReport::PlateauReport(fabric::Fabric& f) : f_(f) {
  const fabric::Config& c = f.config();
  active_ = c.get_string("scheduler.name") == "plateau";
  train_loss_ = active_ && c.get_string("scheduler.monitor") == "train/loss";
  loss_since_report_ = torch::zeros({}, torch::dtype(torch::kDouble).device(f.device()));
}

void PlateauReport::add_to(fabric::CheckpointState& state) {
  if (!train_loss_) return;
  state.add("loss_since_report", loss_since_report_).add("steps_since_report", steps_since_report_);
}

void PlateauReport::step(const torch::Tensor& loss) {
  if (!train_loss_) return;
  loss_since_report_ += f_.all_reduce(loss.detach().to(torch::kDouble));
  ++steps_since_report_;
}

void PlateauReport::report(fabric::LRScheduler& scheduler, double evaluated, int64_t step) {
  if (!active_) return;
  double monitored = evaluated;
  if (train_loss_) {
    const double steps = static_cast<double>(std::max<int64_t>(steps_since_report_, 1));
    monitored = (loss_since_report_ / steps).item<double>();
    loss_since_report_.zero_();
    steps_since_report_ = 0;
  }
  scheduler.report(monitored);
  f_.log_dict({{"scheduler/monitored", monitored}}, step);
}

}  // namespace examples
