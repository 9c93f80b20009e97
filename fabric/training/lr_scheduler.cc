#include "fabric/training/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "fabric/core/error.h"

namespace fabric {
namespace {

double cos_anneal(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(M_PI * pct) + 1.0);
}

}  // namespace

LRSchedule LRSchedule::constant(double base_lr, int64_t warmup_steps) {
  LRSchedule s;
  s.name_ = "none";
  s.base_ = base_lr;
  s.warmup_ = warmup_steps;
  return s;
}

LRSchedule LRSchedule::cosine(double base_lr, int64_t total_steps, int64_t warmup_steps,
                              double min_lr) {
  LRSchedule s = constant(base_lr, warmup_steps);
  s.name_ = "cosine";
  s.total_ = std::max<int64_t>(total_steps, 1);
  s.min_ = min_lr;
  return s;
}

LRSchedule LRSchedule::linear(double base_lr, int64_t total_steps, int64_t warmup_steps,
                              double min_lr) {
  LRSchedule s = cosine(base_lr, total_steps, warmup_steps, min_lr);
  s.name_ = "linear";
  return s;
}

LRSchedule LRSchedule::one_cycle(double max_lr, int64_t total_steps, double pct_start,
                                 double div_factor, double final_div_factor) {
  LRSchedule s;
  s.name_ = "one_cycle";
  s.base_ = max_lr;
  s.total_ = std::max<int64_t>(total_steps, 2);
  s.pct_start_ = pct_start;
  s.div_ = div_factor;
  s.final_div_ = final_div_factor;
  return s;
}

LRSchedule LRSchedule::step(double base_lr, int64_t step_size, double gamma, int64_t warmup_steps) {
  if (step_size < 1 || !(gamma > 0)) {
    throw Error("LRSchedule::step: step_size must be >= 1 and gamma > 0 (got " +
                std::to_string(step_size) + ", " + std::to_string(gamma) + ")");
  }
  LRSchedule s = constant(base_lr, warmup_steps);
  s.name_ = "step";
  s.step_size_ = step_size;
  s.gamma_ = gamma;
  return s;
}

LRSchedule LRSchedule::multistep(double base_lr, std::vector<int64_t> milestones, double gamma,
                                 int64_t warmup_steps) {
  for (size_t i = 0; i < milestones.size(); ++i) {
    if (milestones[i] < 0 || (i > 0 && milestones[i] <= milestones[i - 1])) {
      throw Error("scheduler.milestones: must be non-negative optimizer steps in increasing order");
    }
  }
  if (!(gamma > 0)) throw Error("scheduler.gamma: must be > 0");
  LRSchedule s = constant(base_lr, warmup_steps);
  s.name_ = "multistep";
  s.milestones_ = std::move(milestones);
  s.gamma_ = gamma;
  return s;
}

LRSchedule LRSchedule::plateau(double base_lr, bool maximize, double factor, int64_t patience,
                               double threshold, int64_t cooldown, double min_lr,
                               int64_t warmup_steps) {
  if (!(factor > 0 && factor < 1) || patience < 0 || !(threshold >= 0) || cooldown < 0) {
    throw Error(
        "LRSchedule::plateau: needs 0 < factor < 1, patience >= 0, threshold >= 0 and "
        "cooldown >= 0");
  }
  LRSchedule s = constant(base_lr, warmup_steps);
  s.name_ = "plateau";
  s.maximize_ = maximize;
  s.gamma_ = factor;
  s.patience_ = patience;
  s.threshold_ = threshold;
  s.cooldown_ = cooldown;
  s.min_ = min_lr;
  return s;
}

LRSchedule LRSchedule::from_config(const Config& c, int64_t total_steps) {
  if (total_steps < 1) throw Error("LRSchedule::from_config: total_steps must be >= 1");
  const std::string name = c.get_string("scheduler.name");
  const double lr = c.get_double("optimizer.lr");
  const int64_t warmup = c.get_int("scheduler.warmup_steps");
  const double min_lr = c.get_double("scheduler.min_lr");
  if (name == "cosine") return cosine(lr, total_steps, warmup, min_lr);
  if (name == "linear") return linear(lr, total_steps, warmup, min_lr);
  if (name == "step") {
    return step(lr, c.get_int("scheduler.step_size"), c.get_double("scheduler.gamma"), warmup);
  }
  if (name == "multistep") {
    std::vector<int64_t> milestones;
    for (double m : c.get_double_list("scheduler.milestones")) {
      std::ostringstream text;
      text << m;
      if (m != std::floor(m))
        throw c.error_at("scheduler.milestones",
                         text.str() + " is not a whole number of optimizer steps");
      if (m < 0 || (!milestones.empty() && m <= static_cast<double>(milestones.back())))
        throw c.error_at("scheduler.milestones",
                         text.str() +
                             " breaks the order: milestones are optimizer steps >= 0 in "
                             "increasing order, e.g. [100, 200]");
      milestones.push_back(static_cast<int64_t>(m));
    }
    return multistep(lr, std::move(milestones), c.get_double("scheduler.gamma"), warmup);
  }
  if (name == "plateau") {
    const double gamma = c.get_double("scheduler.gamma");
    if (!(gamma < 1)) throw c.error_at("scheduler.gamma", "plateau: the factor must be < 1");
    return plateau(lr, c.get_string("scheduler.monitor") == "test/accuracy", gamma,
                   c.get_int("scheduler.patience"), c.get_double("scheduler.threshold"),
                   c.get_int("scheduler.cooldown"), min_lr, warmup);
  }
  if (name == "one_cycle") {
    return one_cycle(lr, total_steps, c.get_double("scheduler.pct_start"),
                     c.get_double("scheduler.div_factor"),
                     c.get_double("scheduler.final_div_factor"));
  }
  return constant(lr, warmup);
}

double LRSchedule::decayed_at(int64_t step) const {
  if (name_ == "step") return base_ * std::pow(gamma_, static_cast<double>(step / step_size_));
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step);
  return base_ * std::pow(gamma_, static_cast<double>(passed - milestones_.begin()));
}

double LRSchedule::lr_at(int64_t step) const {
  step = std::max<int64_t>(step, 0);
  if (name_ == "step" || name_ == "multistep") {
    const double at = decayed_at(step);
    return step < warmup_ ? at * static_cast<double>(step + 1) / static_cast<double>(warmup_) : at;
  }
  if (name_ == "one_cycle") {
    step = std::min(step, total_ - 1);
    const double initial = base_ / div_;
    const double final_lr = initial / final_div_;
    const double up_end = std::max(pct_start_ * static_cast<double>(total_) - 1.0, 1e-12);
    const double down_end = static_cast<double>(total_ - 1);
    const double t = static_cast<double>(step);
    if (t <= up_end) return cos_anneal(initial, base_, t / up_end);
    return cos_anneal(base_, final_lr, (t - up_end) / std::max(down_end - up_end, 1e-12));
  }
  if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (name_ == "none" || name_ == "plateau") return base_;
  const double span = static_cast<double>(std::max<int64_t>(total_ - warmup_, 1));
  const double progress = std::min(1.0, static_cast<double>(step - warmup_) / span);
  if (name_ == "linear") return base_ + (min_ - base_) * progress;
  return min_ + (base_ - min_) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer, LRSchedule schedule)
    : optimizer_(optimizer), schedule_(std::move(schedule)) {
  const double base = schedule_.base_lr();
  for (const auto& group : optimizer_.param_groups())
    state_.group_scales.push_back(base > 0 ? group.options().get_lr() / base : 1.0);
  apply();
}

void LRScheduler::step() {
  ++step_;
  apply();
}

void LRScheduler::set_step(int64_t step) {
  step_ = step;
  apply();
}

void LRScheduler::report(double metric) {
  if (schedule_.name() != "plateau") return;
  State& s = state_;
  const double t = schedule_.threshold_;
  // PyTorch's relative threshold: better than best·(1 ± threshold); NaN never is.
  const bool better = !s.has_best           ? !std::isnan(metric)
                      : schedule_.maximize_ ? metric > s.best * (1.0 + t)
                                            : metric < s.best * (1.0 - t);
  if (better) {
    s.best = metric;
    s.has_best = true;
    s.bad_reports = 0;
  } else {
    ++s.bad_reports;
  }
  if (s.cooldown_left > 0) {
    --s.cooldown_left;
    s.bad_reports = 0;
  }
  if (s.bad_reports > schedule_.patience_) {
    const double base = schedule_.base_lr();
    const double now = base * s.lr_factor;
    const double reduced = std::max(now * schedule_.gamma_, schedule_.min_);
    if (now - reduced > 1e-8 && base > 0) s.lr_factor = reduced / base;  // as PyTorch's eps
    s.cooldown_left = schedule_.cooldown_;
    s.bad_reports = 0;
    apply();
  }
}

LRScheduler::State LRScheduler::state() const {
  State s = state_;
  s.step = step_;
  return s;
}

void LRScheduler::load_state(const State& state) {
  if (state.group_scales.size() != optimizer_.param_groups().size()) {
    throw Error("the scheduler state has " + std::to_string(state.group_scales.size()) +
                " parameter-group ratios, the optimizer " +
                std::to_string(optimizer_.param_groups().size()) +
                " groups (optimizer.no_weight_decay / optimizer.lr_scale changed?)");
  }
  state_ = state;
  step_ = state.step;
  apply();
}

c10::IValue LRScheduler::save_state() const {
  const State s = state();
  c10::impl::GenericDict d = new_state_dict();
  d.insert("step", s.step);
  // A plain list (a typed double list pickles as a TorchScript call Python's weights_only loader
  // and ours refuse).
  c10::impl::GenericList scales(c10::AnyType::get());
  for (double x : s.group_scales) scales.push_back(x);
  d.insert("group_scales", scales);
  d.insert("lr_factor", s.lr_factor);
  d.insert("best", s.best);
  d.insert("has_best", s.has_best);
  d.insert("bad_reports", s.bad_reports);
  d.insert("cooldown_left", s.cooldown_left);
  return d;
}

std::function<void()> LRScheduler::prepare_restore(const c10::IValue& saved,
                                                   const std::string& source) {
  State s = state();
  s.step = state_int(saved, "step", source);
  auto number = [&](const char* key, double fallback) {
    return optional_state_field(saved, key, source) ? state_number(saved, key, source) : fallback;
  };
  if (const auto scales = optional_state_field(saved, "group_scales", source)) {
    if (!scales->isList())
      throw Error(source + ": malformed (\"group_scales\" is not a list of numbers)");
    s.group_scales.clear();
    for (const c10::IValue& x : scales->toListRef()) {
      if (!x.isDouble())
        throw Error(source + ": malformed (\"group_scales\" is not a list of numbers)");
      s.group_scales.push_back(x.toDouble());
    }
  }
  s.lr_factor = number("lr_factor", 1.0);
  s.best = number("best", 0.0);
  const auto has_best = optional_state_field(saved, "has_best", source);
  s.has_best = has_best && has_best->isBool() && has_best->toBool();
  s.bad_reports = static_cast<int64_t>(number("bad_reports", 0));
  s.cooldown_left = static_cast<int64_t>(number("cooldown_left", 0));
  const size_t groups = optimizer_.param_groups().size();
  if (s.group_scales.size() != groups) {
    throw Error(source + ": holds " + std::to_string(s.group_scales.size()) +
                " parameter-group ratios, the optimizer has " + std::to_string(groups) +
                " groups (were optimizer.no_weight_decay or optimizer.lr_scale changed?)");
  }
  return [this, s] { load_state(s); };
}

void LRScheduler::apply() {
  const double lr = get_lr();
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    const double scale = g < state_.group_scales.size() ? state_.group_scales[g] : 1.0;
    groups[g].options().set_lr(lr * scale);
  }
}

}  // namespace fabric
