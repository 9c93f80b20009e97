#include "tools/sweep/optuna.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "tools/sweep/pruner.h"
#include "tools/sweep/runner.h"
#include "tools/sweep/setup.h"

namespace fabric::sweep {
namespace fs = std::filesystem;
namespace {

// A number Optuna chose for `d`: an integer, or as random search writes it (space.h number_in).
std::string number_text(double v, const Distribution& d) {
  if (d.kind == "int") {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
    return buf;
  }
  return number_in(d, v);
}

// `path` for the database part of an SQLAlchemy URL: '%', '?' and '#' percent-encoded (SQLAlchemy
// decodes them; unencoded, '?' starts the query, '#' a fragment and '%XX' is read as a byte).
std::string url_path(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '%')
      out += "%25";
    else if (c == '?')
      out += "%3F";
    else if (c == '#')
      out += "%23";
    else
      out += c;
  }
  return out;
}

fs::path find_bridge() {
  if (const auto runfiles = runfiles_directory()) {
    const fs::path p = *runfiles / "tools" / "sweep" / "optuna_bridge.py";
    if (fs::is_regular_file(p)) return p;
  }
  // Installed (bazel run //tools:install -- PREFIX): PREFIX/bin/fabric-sweep beside
  // PREFIX/share/fabricpp/optuna_bridge.py.
  std::error_code ec;
  const fs::path installed = fs::read_symlink("/proc/self/exe", ec).parent_path() / ".." / "share" /
                             "fabricpp" / "optuna_bridge.py";
  if (!ec && fs::is_regular_file(installed)) return installed.lexically_normal();
  const fs::path in_tree = absolute_from_working_directory("tools/sweep/optuna_bridge.py");
  if (fs::is_regular_file(in_tree)) return in_tree;
  throw Error(
      "tools/sweep/optuna_bridge.py is not bundled with this sweep binary (run it with "
      "bazel run //tools/sweep, or install it: bazel run //tools:install -- PREFIX)");
}

}  // namespace

OptunaStudy::OptunaStudy(const SweepSpec& spec, const fs::path& sweep_dir) : spec_(spec) {
  const char* python = std::getenv("PYTHON");
  python_ = python != nullptr && *python != '\0' ? python : "python3";
  storage_ = spec.storage.empty() ? "sqlite:///" + url_path((sweep_dir / "optuna.db").string())
                                  : spec.storage;
  // A SQLite file in a folder that is not there (or not writable) is said now, at its line.
  if (!spec.storage.empty() && spec.storage.rfind("sqlite:///", 0) == 0) {
    const fs::path db = spec.storage.substr(10);  // sqlite:////abs/x.db, sqlite:///relative.db
    const fs::path folder = db.has_parent_path() ? db.parent_path() : fs::path(".");
    std::error_code ec;
    if (!fs::is_directory(folder, ec) || access(folder.c_str(), W_OK | X_OK) != 0)
      throw ConfigError(spec.storage_mark + ": storage: " + spec.storage + ": the folder " +
                        folder.string() +
                        " is not there or not writable; create it, or leave storage: out (the "
                        "study then lives in <sweep dir>/optuna.db)");
  }
  try {
    bridge_ = find_bridge();
    run({"check", "--sampler=" + spec.sampler});
  } catch (const Error& e) {
    throw ConfigError(spec.search_origin + ": search: optuna: " + e.what());
  }
}

std::string OptunaStudy::run(const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {"/usr/bin/env", python_, bridge_.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  const Captured c = run_captured(argv, fs::current_path());
  if (c.code != 0) {
    std::string line = last_line(c.output);
    const std::string prefix = "optuna_bridge: ";
    if (line.rfind(prefix, 0) == 0) line = line.substr(prefix.size());
    throw Error(line.empty() ? "the Optuna bridge exited " + std::to_string(c.code) : line);
  }
  return c.output;
}

std::pair<int64_t, Overrides> OptunaStudy::ask() const {
  nlohmann::json space = nlohmann::json::array();
  for (const auto& [key, d] : spec_.space) {
    nlohmann::json spec = {{"kind", d.kind}};
    if (d.kind == "choice") {
      spec["values"] = d.values;
    } else {
      spec["low"] = d.low;
      spec["high"] = d.high;
    }
    space.push_back({key, spec});
  }
  const std::string out =
      run({"ask", "--storage=" + storage_, "--study=" + spec_.study,
           std::string("--direction=") + (spec_.maximize ? "maximize" : "minimize"),
           "--sampler=" + spec_.sampler, "--seed=" + std::to_string(spec_.random_seed),
           "--space=" + space.dump()});
  nlohmann::json answer;
  try {
    answer = nlohmann::json::parse(last_line(out));
  } catch (const std::exception& e) {
    throw Error("the Optuna bridge's answer is not JSON: " + last_line(out));
  }
  Overrides values;
  for (const auto& [key, d] : spec_.space) {
    const auto& v = answer.at("params").at(key);
    values.emplace_back(key,
                        v.is_string() ? v.get<std::string>() : number_text(v.get<double>(), d));
  }
  return {answer.at("number").get<int64_t>(), values};
}

void OptunaStudy::tell(int64_t number, double value) const {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.17g", value);
  run({"tell", "--storage=" + storage_, "--study=" + spec_.study,
       "--number=" + std::to_string(number), std::string("--value=") + buf});
}

void OptunaStudy::tell(int64_t number, const std::string& state) const {
  run({"tell", "--storage=" + storage_, "--study=" + spec_.study,
       "--number=" + std::to_string(number), "--state=" + state});
}

bool OptunaStudy::report(int64_t number, const std::map<double, double>& reports,
                         const PrunerSpec& pruner) const {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [at, value] : reports) list.push_back({at, value});
  char low[32];
  std::snprintf(low, sizeof(low), "%.0f", pruner.min_resource);
  const std::string out = run({"report", "--storage=" + storage_, "--study=" + spec_.study,
                               "--number=" + std::to_string(number), "--reports=" + list.dump(),
                               "--pruner=" + pruner.type, std::string("--min=") + low,
                               "--min_runs=" + std::to_string(pruner.min_runs),
                               "--factor=" + std::to_string(pruner.reduction_factor)});
  return last_line(out) == "prune";
}

SweepRun trial_run(const SweepSpec& spec, int64_t number, const Overrides& values) {
  SweepRun run;
  run.overrides = values;
  run.origin = spec.search_origin;
  for (size_t i = 0; i < values.size(); ++i) run.value_origin.push_back(spec.search_origin);
  run.id = point_id(spec.swept_keys, values, std::nullopt, "t" + std::to_string(number) + "_");
  return run;
}

void add_recorded_trials(SweepSpec& spec, SweepState& state) {
  spec.runs.reserve(static_cast<size_t>(std::max<int64_t>(spec.trials, 0)) + state.runs().size());
  std::vector<std::pair<int64_t, std::string>> trials;
  for (const auto& [id, rec] : state.runs())
    if (rec.trial >= 0) trials.emplace_back(rec.trial, id);
  std::sort(trials.begin(), trials.end());
  for (const auto& [number, id] : trials) {
    SweepRun run = trial_run(spec, number, state[id].values);
    run.id = id;  // as recorded
    spec.runs.push_back(std::move(run));
  }
}

SweepRun probe_run(const SweepSpec& spec, bool high) {
  Overrides values;
  for (const auto& [key, d] : spec.space)
    values.emplace_back(key, d.kind == "choice" ? (high ? d.values.back() : d.values.front())
                                                : number_text(high ? d.high : d.low, d));
  SweepRun run = trial_run(spec, 0, values);
  run.id = high ? "probe_high" : "probe";
  return run;
}

namespace {

// The stop reason of a run Optuna's pruner stopped, at its last report.
std::string optuna_stop_reason(const PrunerSpec& pruner, const RunRecord& rec) {
  const auto& last = *rec.reports.rbegin();
  char value[32];
  std::snprintf(value, sizeof(value), "%.4g", last.second);
  return "Optuna's " +
         std::string(pruner.type == "median" ? "MedianPruner" : "SuccessiveHalvingPruner") +
         " stopped it at " + resource_text(pruner, last.first) + " (" + pruner.metric + " " +
         value + ")";
}

}  // namespace

void connect(const OptunaStudy& study, SweepSpec& spec, SweepState& state, RunnerOptions& options,
             std::ostream& out) {
  add_recorded_trials(spec, state);
  SweepSpec probe = spec;  // the keys, checked once before anything is asked
  probe.runs = {probe_run(spec), probe_run(spec, /*high=*/true)};
  SweepState none;
  preflight(probe, none, options);
  options.more_runs = static_cast<int>(std::max<int64_t>(0, spec.trials - spec.runs.size()));
  options.next_run = [&]() -> const SweepRun* {
    if (static_cast<int64_t>(spec.runs.size()) >= spec.trials) return nullptr;
    const auto [number, values] = study.ask();
    spec.runs.push_back(trial_run(spec, number, values));
    auto& rec = state[spec.runs.back().id];
    rec.trial = number;
    rec.values = values;
    state.save();
    return &spec.runs.back();
  };
  if (!spec.pruner.type.empty()) {  // Optuna's pruners decide
    options.external_pruner = [&](const SweepRun& run,
                                  const RunRecord& rec) -> std::optional<std::string> {
      // No bridge call where Optuna cannot decide yet: before min, and (median) while fewer than
      // min_runs trials finished. The reports so far go with the next call, or with the result.
      if (rec.reports.rbegin()->first < spec.pruner.min_resource) return std::nullopt;
      if (spec.pruner.type == "median") {
        int finished = 0;
        for (const auto& [id, r] : state.runs())
          finished += r.trial >= 0 && r.status == RunStatus::kDone;
        if (finished < spec.pruner.min_runs) return std::nullopt;
      }
      try {
        if (!study.report(rec.trial, rec.reports, spec.pruner)) return std::nullopt;
      } catch (const Error& e) {
        out << "warning: Optuna's pruner was not asked about " << run.id << ": " << e.what()
            << std::endl;
        return std::nullopt;
      }
      return optuna_stop_reason(spec.pruner, rec);
    };
  }
  options.on_result = [&](const SweepRun& run, const RunRecord& rec) {
    try {
      // Every report of the run, so that Optuna's pruners compare later trials with whole curves.
      if (!spec.pruner.type.empty() && !rec.reports.empty())
        study.report(rec.trial, rec.reports, spec.pruner);
      if (rec.status == RunStatus::kDone && rec.summary.contains(spec.metric) &&
          rec.summary[spec.metric].is_number()) {
        study.tell(rec.trial, rec.summary[spec.metric].get<double>());
      } else {
        study.tell(rec.trial, rec.status == RunStatus::kPruned ? "pruned" : "fail");
      }
    } catch (const Error& e) {
      out << "warning: Optuna was not told how trial " << rec.trial << " (" << run.id
          << ") ended: " << e.what() << std::endl;
    }
  };
}

}  // namespace fabric::sweep
