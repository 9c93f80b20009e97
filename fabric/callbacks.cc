#include "fabric/callbacks.h"

#include <cmath>
#include <sstream>

#include "fabric/core/error.h"

namespace fabric {
namespace {

std::string number(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

}  // namespace

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  if (options_.monitor.empty()) throw Error("EarlyStopping: no metric to monitor");
  if (options_.mode != "max" && options_.mode != "min" && options_.mode != "auto")
    throw Error("EarlyStopping: mode '" + options_.mode + "' is not max, min or auto");
  if (options_.patience < 1) throw Error("EarlyStopping: patience must be >= 1");
  if (!(options_.min_delta >= 0)) throw Error("EarlyStopping: min_delta must be >= 0");
  maximize_ = options_.mode == "max" ||
              (options_.mode == "auto" && options_.monitor.find("loss") == std::string::npos);
}

void EarlyStopping::on_validation_end(Fabric&, int64_t step, const Metrics& metrics) {
  const auto it = metrics.find(options_.monitor);
  if (it == metrics.end()) {
    std::string there;
    for (const auto& [name, value] : metrics) there += (there.empty() ? "" : ", ") + name;
    throw Error("callbacks.early_stopping.monitor: no metric '" + options_.monitor +
                "' at validation end (there: " + (there.empty() ? "none" : there) + ")");
  }
  const double value = it->second;
  const bool improved =
      std::isfinite(value) && (!best_ || (maximize_ ? value > *best_ + options_.min_delta
                                                    : value < *best_ - options_.min_delta));
  if (improved) {
    best_ = value;
    best_step_ = step;
    wait_ = 0;
    return;
  }
  if (++wait_ < options_.patience) return;
  reason_ = "early stopping at step " + std::to_string(step) + ": " + options_.monitor +
            " did not " + (maximize_ ? "rise" : "fall") + " by more than " +
            number(options_.min_delta) + " in " + std::to_string(wait_) + " evaluations (best " +
            (best_ ? number(*best_) + " at step " + std::to_string(best_step_) : "none") + ")";
}

c10::IValue EarlyStopping::save_state() const {
  auto d = new_state_dict();
  d.insert("monitor", options_.monitor);
  d.insert("has_best", best_.has_value());
  d.insert("best", best_.value_or(0.0));
  d.insert("best_step", best_step_);
  d.insert("wait", wait_);
  return d;
}

std::function<void()> EarlyStopping::prepare_restore(const c10::IValue& saved,
                                                     const std::string& source) {
  const c10::IValue monitor = state_field(saved, "monitor", source);
  if (!monitor.isString()) throw Error(state_type_error(source + ".monitor", "a string", monitor));
  if (monitor.toStringRef() != options_.monitor) return [] {};  // another metric: start afresh
  const c10::IValue has_best = state_field(saved, "has_best", source);
  if (!has_best.isBool()) throw Error(state_type_error(source + ".has_best", "a bool", has_best));
  const double best = state_number(saved, "best", source);
  const int64_t best_step = state_int(saved, "best_step", source);
  const int64_t wait = state_int(saved, "wait", source);
  return [this, has = has_best.toBool(), best, best_step, wait] {
    best_ = has ? std::optional<double>(best) : std::nullopt;
    best_step_ = best_step;
    wait_ = wait;
    reason_.clear();
  };
}

std::vector<std::shared_ptr<Callback>> make_callbacks(const Config& config) {
  std::vector<std::shared_ptr<Callback>> out;
  EarlyStoppingOptions early;
  early.monitor = config.get_string("callbacks.early_stopping.monitor");
  if (!early.monitor.empty()) {
    early.mode = config.get_string("callbacks.early_stopping.mode");
    early.patience = config.get_int("callbacks.early_stopping.patience");
    early.min_delta = config.get_double("callbacks.early_stopping.min_delta");
    out.push_back(std::make_shared<EarlyStopping>(early));
  }
  return out;
}

}  // namespace fabric
