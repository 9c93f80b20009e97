#include "fabric/callbacks.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "fabric/core/error.h"
#include "fabric/fabric.h"

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

namespace {

std::string bytes_text(int64_t bytes) {
  std::ostringstream out;
  out.precision(3);
  if (bytes >= (int64_t{1} << 20)) {
    out << static_cast<double>(bytes) / (1 << 20) << " MiB";
  } else if (bytes >= 1024) {
    out << static_cast<double>(bytes) / 1024 << " KiB";
  } else {
    out << bytes << " B";
  }
  return out.str();
}

}  // namespace

ModelSummary::ModelSummary(const torch::nn::Module& module) {
  struct Row {
    std::string name, type;
    int64_t params = 0, bytes = 0;
  };
  std::vector<Row> rows;
  int64_t total = 0, trainable = 0, bytes = 0;
  const auto count = [](const torch::Tensor& p) { return p.defined() ? p.numel() : int64_t{0}; };
  for (const auto& child : module.named_children()) {
    Row row{child.key(), child.value()->name()};
    if (row.type.size() > 4 && row.type.compare(row.type.size() - 4, 4, "Impl") == 0)
      row.type.resize(row.type.size() - 4);  // torch::nn::LinearImpl → torch::nn::Linear
    for (const auto& p : child.value()->parameters()) {
      row.params += count(p);
      row.bytes += count(p) * static_cast<int64_t>(p.element_size());
    }
    rows.push_back(row);
  }
  for (const auto& p : module.parameters()) {
    total += count(p);
    if (p.requires_grad()) trainable += count(p);
    bytes += count(p) * static_cast<int64_t>(p.element_size());
  }
  size_t name_width = 4, type_width = 4;
  for (const auto& r : rows) {
    name_width = std::max(name_width, r.name.size());
    type_width = std::max(type_width, r.type.size());
  }
  const auto pad = [](const std::string& s, size_t w) {
    return s + std::string(w - s.size(), ' ');
  };
  lines_.push_back(pad("name", name_width) + "  " + pad("type", type_width) +
                   "  parameters  bytes");
  for (const auto& r : rows)
    lines_.push_back(pad(r.name, name_width) + "  " + pad(r.type, type_width) + "  " +
                     pad(std::to_string(r.params), 10) + "  " + bytes_text(r.bytes));
  lines_.push_back("total " + std::to_string(total) + " parameters (" + std::to_string(trainable) +
                   " trainable), " + bytes_text(bytes));
}

void ModelSummary::on_fit_start(Fabric& f) {
  for (const auto& line : lines_) f.print(line);
}

LearningRateMonitor::LearningRateMonitor(const torch::optim::Optimizer& optimizer, int64_t every)
    : optimizer_(optimizer), every_(std::max<int64_t>(every, 1)) {}

void LearningRateMonitor::on_train_batch_end(Fabric& f, int64_t step, const Metrics&) {
  if (step % every_ != 0) return;
  Metrics rates;
  const auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g)
    rates["lr/group_" + std::to_string(g)] = groups[g].options().get_lr();
  f.log_dict(rates, step);
}

void ProfilerCallback::on_train_batch_end(Fabric& f, int64_t, const Metrics&) {
  if (!profiler_) {
    options_.dir = f.run_directory().path() / "profiler";
    options_.rank = f.global_rank();
    if (!f.device().is_cuda()) options_.cuda = false;  // no kernels to record
    profiler_ = std::make_unique<StepProfiler>(options_);
  }
  profiler_->step();
}

void ProfilerCallback::on_fit_end(Fabric& f) {
  if (!profiler_ || profiler_->traces().empty()) return;
  f.print("profiler: ", profiler_->traces().size(), " trace(s) per rank in ", options_.dir.string(),
          " (open in ui.perfetto.dev or TensorBoard); rank 0's ops:\n", profiler_->table());
}

void add_stateful_callbacks(const Fabric& f, CheckpointState& state) {
  for (const auto& callback : f.callbacks())
    if (auto* stateful = dynamic_cast<Stateful*>(callback.get()))
      state.add("callbacks." + callback->name(), *stateful);
}

std::optional<StepProfilerOptions> profiler_options(const Config& config) {
  if (!config.get_bool("profiler.enabled")) return std::nullopt;
  StepProfilerOptions o;
  o.wait = config.get_int("profiler.wait");
  o.warmup = config.get_int("profiler.warmup");
  o.active = config.get_int("profiler.active");
  o.repeat = config.get_int("profiler.repeat");
  const auto activities = config.get_string_list("profiler.activities");
  o.cpu = std::find(activities.begin(), activities.end(), "cpu") != activities.end();
  o.cuda = std::find(activities.begin(), activities.end(), "cuda") != activities.end();
  if (!o.cpu && !o.cuda) throw config.error_at("profiler.activities", "name cpu, cuda or both");
  o.record_shapes = config.get_bool("profiler.record_shapes");
  o.profile_memory = config.get_bool("profiler.profile_memory");
  o.with_stack = config.get_bool("profiler.with_stack");
  o.row_limit = config.get_int("profiler.row_limit");
  return o;
}

std::vector<std::shared_ptr<Callback>> make_callbacks(const Config& config,
                                                      const torch::nn::Module* module,
                                                      const torch::optim::Optimizer* optimizer) {
  std::vector<std::shared_ptr<Callback>> out;
  if (auto o = profiler_options(config)) out.push_back(std::make_shared<ProfilerCallback>(*o));
  if (config.get_bool("callbacks.model_summary")) {
    if (!module)
      throw config.error_at("callbacks.model_summary", "this program passes no model to watch");
    out.push_back(std::make_shared<ModelSummary>(*module));
  }
  if (config.get_bool("callbacks.lr_monitor")) {
    if (!optimizer)
      throw config.error_at("callbacks.lr_monitor", "this program passes no optimizer to watch");
    out.push_back(std::make_shared<LearningRateMonitor>(
        *optimizer, config.get_int("logging.log_every_n_steps")));
  }
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
