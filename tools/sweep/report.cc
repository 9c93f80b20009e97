#include "tools/sweep/report.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"

namespace fabric::sweep {
namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof(buf), std::fabs(v) >= 100 ? "%.1f" : "%.4f", v);
  return buf;
}

std::string exact(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

std::string value_of(const SweepRun& run, const std::string& key) {
  for (const auto& [k, v] : run.overrides)
    if (k == key) return v;
  return "";
}

// Numeric fields of the summaries, the metric first.
std::vector<std::string> metric_columns(const SweepSpec& spec,
                                        const std::map<std::string, RunRecord>& records) {
  std::vector<std::string> cols = {spec.metric};
  for (const SweepRun& run : spec.runs) {
    auto it = records.find(run.id);
    if (it == records.end() || !it->second.summary.is_object()) continue;
    for (const auto& [k, v] : it->second.summary.items()) {
      if (v.is_number() && std::find(cols.begin(), cols.end(), k) == cols.end()) cols.push_back(k);
    }
  }
  return cols;
}

bool started(const std::map<std::string, RunRecord>& records, const std::string& id) {
  auto it = records.find(id);
  return it != records.end() && it->second.status != RunStatus::kPending;
}

}  // namespace

Stats stats_of(const std::vector<double>& values) {
  Stats s;
  s.n = static_cast<int>(values.size());
  if (s.n == 0) return s;
  for (double v : values) s.mean += v;
  s.mean /= s.n;
  if (s.n > 1) {
    double ss = 0;
    for (double v : values) ss += (v - s.mean) * (v - s.mean);
    s.std = std::sqrt(ss / (s.n - 1));
  }
  return s;
}

std::string results_csv(const SweepSpec& spec, const std::map<std::string, RunRecord>& records) {
  const auto metrics = metric_columns(spec, records);
  std::vector<std::string> header = {"run", "status", "exit_code", "attempts"};
  for (const auto& k : spec.swept_keys) header.push_back(k);
  header.push_back("seed");
  for (const auto& m : metrics) header.push_back(m);
  for (const char* tail : {"wall_time_s", "run_dir", "reason"}) header.push_back(tail);
  std::ostringstream out;
  std::vector<std::string> cells;
  for (const auto& h : header) cells.push_back(csv_field(h));
  out << join(cells, ",") << "\n";
  for (const SweepRun& run : spec.runs) {
    if (!started(records, run.id)) continue;
    const RunRecord& r = records.at(run.id);
    cells = {csv_field(run.id), to_string(r.status), std::to_string(r.exit_code),
             std::to_string(r.attempts)};
    for (const auto& k : spec.swept_keys) cells.push_back(csv_field(value_of(run, k)));
    cells.push_back(run.seed ? std::to_string(*run.seed) : "");
    for (const auto& m : metrics) {
      const bool has = r.summary.is_object() && r.summary.contains(m) && r.summary[m].is_number();
      cells.push_back(has ? exact(r.summary[m].get<double>()) : "");
    }
    cells.push_back(exact(r.wall_seconds));
    cells.push_back(csv_field(r.run_dir));
    cells.push_back(csv_field(r.reason));
    out << join(cells, ",") << "\n";
  }
  return out.str();
}

namespace {

// A point of the sweep (its swept values) with its runs' results.
struct Point {
  std::vector<std::string> values;
  std::vector<double> metric, wall;
  std::vector<std::string> done_ids;  // the runs behind `metric`, in the same order
  int runs = 0;
  int diverged = 0;
  int pruned = 0;
  int unfinished() const { return diverged + pruned; }
  // Every run of the point finished with the metric (none failed, diverged, pruned or not run).
  bool complete() const { return static_cast<int>(metric.size()) == runs; }
};

// The points, best first: those whose runs all finished by the metric (mode), then those with a
// failed, diverged, pruned or not yet run run (by the metric of the rest: a point is not ranked
// by its one lucky surviving seed), then those without a metric (the ones with pruned runs before
// the ones with diverged runs).
std::vector<Point> ranked_points(const SweepSpec& spec,
                                 const std::map<std::string, RunRecord>& records) {
  std::vector<Point> points;
  std::map<std::vector<std::string>, size_t> index;
  for (const SweepRun& run : spec.runs) {
    std::vector<std::string> values;
    for (const auto& k : spec.swept_keys) values.push_back(value_of(run, k));
    auto [it, inserted] = index.emplace(values, points.size());
    if (inserted) points.push_back({values, {}, {}, {}, 0, 0, 0});
    Point& p = points[it->second];
    ++p.runs;
    auto rec = records.find(run.id);
    if (rec != records.end() && rec->second.status == RunStatus::kDiverged) ++p.diverged;
    if (rec != records.end() && rec->second.status == RunStatus::kPruned) ++p.pruned;
    if (rec == records.end() || rec->second.status != RunStatus::kDone) continue;
    const auto& summary = rec->second.summary;
    if (summary.is_object() && summary.contains(spec.metric) && summary[spec.metric].is_number()) {
      p.metric.push_back(summary[spec.metric].get<double>());
      p.wall.push_back(rec->second.wall_seconds);
      p.done_ids.push_back(run.id);
    }
  }
  std::stable_sort(points.begin(), points.end(), [&](const Point& a, const Point& b) {
    if (a.metric.empty() != b.metric.empty()) return b.metric.empty();
    if (a.metric.empty()) {
      if ((a.pruned > 0) != (b.pruned > 0)) return a.pruned > 0;
      return a.unfinished() > b.unfinished();
    }
    if (a.complete() != b.complete()) return a.complete();
    const double ma = stats_of(a.metric).mean, mb = stats_of(b.metric).mean;
    return spec.maximize ? ma > mb : ma < mb;
  });
  return points;
}

}  // namespace

std::string results_markdown(const SweepSpec& spec,
                             const std::map<std::string, RunRecord>& records) {
  const std::vector<Point> points = ranked_points(spec, records);

  const auto names = short_names(spec.swept_keys);
  std::ostringstream out;
  out << "| rank |";
  for (const auto& k : spec.swept_keys) out << " " << names.at(k) << " |";
  out << " " << spec.metric << " (" << (spec.maximize ? "max" : "min") << ") | "
      << (spec.seeds.empty() ? "runs" : "seeds") << " | wall s |\n|---:|";
  for (size_t i = 0; i < spec.swept_keys.size(); ++i) out << "---|";
  out << "---:|---:|---:|\n";
  int rank = 0;
  for (const Point& p : points) {
    const Stats m = stats_of(p.metric), w = stats_of(p.wall);
    const bool ranked = !p.metric.empty() || p.unfinished() > 0;
    out << "| " << (ranked ? std::to_string(++rank) : std::string("–")) << " |";
    for (const auto& v : p.values) out << " " << (v.empty() ? "–" : v) << " |";
    if (m.n == 0) {
      out << " – |";
    } else if (m.n == 1) {
      out << " " << number(m.mean) << " |";
    } else {
      out << " " << number(m.mean) << " ± " << number(m.std) << " |";
    }
    char wall[32];
    std::snprintf(wall, sizeof(wall), "%.1f", w.mean);
    out << " " << m.n << "/" << p.runs
        << (p.diverged > 0 ? ", " + std::to_string(p.diverged) + " diverged" : std::string())
        << (p.pruned > 0 ? ", " + std::to_string(p.pruned) + " pruned" : std::string()) << " | "
        << (w.n ? wall : "–") << " |\n";
  }
  return out.str();
}

std::optional<BestConfig> best_config(const SweepSpec& spec,
                                      const std::map<std::string, RunRecord>& records,
                                      const std::filesystem::path& best_yaml) {
  const std::vector<Point> points = ranked_points(spec, records);
  if (points.empty() || points[0].metric.empty() || !points[0].complete()) return std::nullopt;
  const Point& p = points[0];
  size_t best = 0;
  for (size_t i = 1; i < p.metric.size(); ++i)
    if (spec.maximize ? p.metric[i] > p.metric[best] : p.metric[i] < p.metric[best]) best = i;
  const RunRecord& rec = records.at(p.done_ids[best]);
  const std::filesystem::path source = std::filesystem::path(rec.run_dir) / "config.yaml";
  YAML::Node config;
  try {
    config = YAML::LoadFile(source.string());
  } catch (const YAML::Exception& e) {
    throw Error("cannot read " + source.string() + ": " + e.what());
  }
  if (!config.IsMap()) throw Error(source.string() + " is not a YAML mapping");
  // Where the sweep put the run and how it resumed it are the sweep's business, not the config's.
  for (const auto& [section, key] :
       {std::pair<const char*, const char*>{"logging", "run_dir"}, {"checkpoint", "resume"}}) {
    if (config[section].IsMap()) {
      config[section].remove(key);
      if (config[section].size() == 0) config.remove(section);
    }
  }
  const Stats m = stats_of(p.metric);
  std::ostringstream text;
  text << "# The best run of sweep " << spec.name << " (" << spec.metric << ", "
       << (spec.maximize ? "max" : "min") << "): " << p.done_ids[best] << ", " << spec.metric << " "
       << exact(p.metric[best]) << "; its point ranks first with " << number(m.mean);
  if (m.n > 1) text << " ± " << number(m.std) << " over " << m.n << " runs";
  text << ".\n# Its resolved config.yaml, logging.run_dir and checkpoint.resume left to their "
          "defaults. Re-run:\n#   "
       << (spec.binary.rfind("//", 0) == 0 ? "bazel run " + spec.binary + " -- "
                                           : spec.binary + " ")
       << "--config=" << best_yaml.string() << "\n";
  YAML::Emitter out;
  out << config;
  text << out.c_str() << "\n";
  return BestConfig{p.done_ids[best], text.str()};
}

int write_report(const SweepSpec& spec, SweepState& state, const std::filesystem::path& sweep_dir,
                 int run_code, std::ostream& out) {
  const auto& records = state.runs();
  const std::string table = results_markdown(spec, records);
  write_file_atomically(sweep_dir / "results.csv", results_csv(spec, records));
  write_file_atomically(sweep_dir / "results.md", "# Sweep " + spec.name + "\n\n" + table);
  std::string best_line;
  try {
    if (const auto best = best_config(spec, records, sweep_dir / "best.yaml")) {
      write_file_atomically(sweep_dir / "best.yaml", best->yaml);
      best_line = "best: " + best->run_id + " -> " + display_path(sweep_dir / "best.yaml") + "\n";
    } else {
      // Runs finished but none has the metric: a typo in metric: ranks nothing; say so once.
      std::vector<std::string> keys;
      bool any_done = false, any_metric = false;
      for (const auto& [id, rec] : records) {
        if (rec.status != RunStatus::kDone || !rec.summary.is_object()) continue;
        any_done = true;
        any_metric |= rec.summary.contains(spec.metric) && rec.summary[spec.metric].is_number();
        if (keys.empty())
          for (const auto& [k, v] : rec.summary.items())
            if (v.is_number()) keys.push_back(k);
      }
      if (any_done && !any_metric) {
        best_line = "best.yaml not written: no finished run's summary.json has metric '" +
                    spec.metric + "'" + did_you_mean(spec.metric, keys) +
                    " (its numbers: " + join_cut(keys) + "); set metric: in " + spec.file +
                    " and run again (finished runs are not repeated)\n";
      } else if (any_metric) {
        const auto points = ranked_points(spec, records);
        if (!points.empty() && !points[0].complete() && !points[0].metric.empty())
          best_line = "best.yaml not written: no point has all its runs finished with " +
                      spec.metric + " (the first-ranked, with " + points[0].done_ids.front() +
                      ", has " + std::to_string(points[0].metric.size()) + " of " +
                      std::to_string(points[0].runs) +
                      "); run the same command again to retry the others\n";
      }
    }
  } catch (const Error& e) {  // the results stand without it
    best_line = std::string("best.yaml not written: ") + e.what() + "\n";
  }
  {
    // Finished runs without the metric are not ranked: say which, when other runs have it.
    std::vector<std::string> lacking, keys;
    bool any_metric = false;
    for (const SweepRun& run : spec.runs) {
      auto it = records.find(run.id);
      if (it == records.end() || it->second.status != RunStatus::kDone) continue;
      const auto& summary = it->second.summary;
      if (summary.is_object() && summary.contains(spec.metric) &&
          summary[spec.metric].is_number()) {
        any_metric = true;
      } else {
        lacking.push_back(run.id);
        if (keys.empty() && summary.is_object())
          for (const auto& [k, v] : summary.items())
            if (v.is_number()) keys.push_back(k);
      }
    }
    if (any_metric && !lacking.empty())
      best_line += "warning: " + std::to_string(lacking.size()) +
                   " finished run(s) have no number '" + spec.metric + "' in summary.json (" +
                   lacking.front() + did_you_mean(spec.metric, keys) +
                   " (its numbers: " + join_cut(keys) + ")); they are not ranked\n";
  }
  int done = 0, diverged = 0, pruned = 0, failed = 0, submitted = 0, left = 0;
  for (const SweepRun& run : spec.runs) {
    auto it = records.find(run.id);
    const RunStatus s = it == records.end() ? RunStatus::kPending : it->second.status;
    if (s == RunStatus::kDone) {
      ++done;
    } else if (s == RunStatus::kDiverged) {
      ++diverged;
      out << "diverged: " << run.id << ": " << it->second.reason << "\n";
    } else if (s == RunStatus::kPruned) {
      ++pruned;
      out << "pruned: " << run.id << ": "
          << it->second.reason.substr(it->second.reason.find(' ') + 1) << "\n";
    } else if (s == RunStatus::kFailed) {
      ++failed;
      out << "failed: " << run.id << ": " << it->second.reason << "\n";
    } else if (s == RunStatus::kSubmitted) {
      ++submitted;
    } else {
      ++left;
    }
  }
  out << "\n"
      << table << "\n"
      << done << " done, " << (diverged > 0 ? std::to_string(diverged) + " diverged, " : "")
      << (pruned > 0 ? std::to_string(pruned) + " pruned, " : "") << failed << " failed, "
      << (submitted > 0 ? std::to_string(submitted) + " queued or running in SLURM, " : "") << left
      << " not run; " << display_path(sweep_dir / "results.csv") << ", "
      << display_path(sweep_dir / "results.md") << "\n"
      << best_line;
  if (submitted > 0)
    out << "run the same command again to gather the SLURM runs once they end (squeue --me)\n";
  else if (left > 0 || failed > 0)
    out << "run the same command again to run the rest\n";
  out.flush();
  if (run_code != 0) return run_code;
  return failed > 0 ? 1 : 0;
}

}  // namespace fabric::sweep
