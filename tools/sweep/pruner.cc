#include "tools/sweep/pruner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "fabric/core/suggest.h"

namespace fabric::sweep {
namespace {

std::string value_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

std::vector<std::string> split_csv_line(const std::string& line) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(line);
  while (std::getline(in, cell, ',')) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

bool parse_number(const std::string& text, double* out) {
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

bool better(const PrunerSpec& spec, double a, double b) { return spec.maximize ? a > b : a < b; }

double rung_resource(const PrunerSpec& spec, int k) {
  return spec.min_resource * std::pow(static_cast<double>(spec.reduction_factor), k);
}

// The run's value at rung k: its first report at or past the rung.
std::optional<double> value_at_rung(const PrunerSpec& spec, const RunRecord& rec, int k) {
  auto it = rec.reports.lower_bound(rung_resource(spec, k) - 1e-9);
  if (it == rec.reports.end()) return std::nullopt;
  return it->second;
}

// The values at rung k of the runs judged there (passed it or were stopped at it), `except` left
// out.
std::vector<double> judged_at(const PrunerSpec& spec, int k,
                              const std::map<std::string, RunRecord>& records,
                              const std::string& except = "") {
  std::vector<double> values;
  for (const auto& [id, rec] : records) {
    if (rec.rung < k || id == except) continue;
    if (auto v = value_at_rung(spec, rec, k)) values.push_back(*v);
  }
  return values;
}

int rank_of(const PrunerSpec& spec, double value, const std::vector<double>& values) {
  return static_cast<int>(std::count_if(values.begin(), values.end(),
                                        [&](double v) { return better(spec, v, value); }));
}

std::optional<std::string> decide_median(const PrunerSpec& spec, const std::string& id,
                                         const std::map<std::string, RunRecord>& records) {
  const RunRecord& rec = records.at(id);
  const double t = rec.reports.rbegin()->first;
  if (t < spec.min_resource) return std::nullopt;
  double best = rec.reports.begin()->second;
  for (const auto& [at, v] : rec.reports)
    if (better(spec, v, best)) best = v;
  std::vector<double> others;
  for (const auto& [other, r] : records) {
    if (other == id || r.status != RunStatus::kDone) continue;
    auto it = r.reports.find(t);
    if (it != r.reports.end()) others.push_back(it->second);
  }
  if (others.empty() || static_cast<int>(others.size()) < spec.min_runs) return std::nullopt;
  std::sort(others.begin(), others.end());
  const size_t n = others.size();
  const double median = n % 2 ? others[n / 2] : (others[n / 2 - 1] + others[n / 2]) / 2;
  if (!better(spec, median, best)) return std::nullopt;
  return spec.metric + " " + value_text(best) + " (best by " + resource_text(spec, t) + ") is " +
         (spec.maximize ? "below" : "above") + " the median " + value_text(median) + " of the " +
         std::to_string(n) + " finished run(s) at " + resource_text(spec, t) + " (pruner: median)";
}

std::optional<std::string> decide_asha(const PrunerSpec& spec, const std::string& id,
                                       const std::map<std::string, RunRecord>& records, int* rung) {
  const RunRecord& rec = records.at(id);
  const double t = rec.reports.rbegin()->first;
  while (rung_resource(spec, *rung + 1) <= t + 1e-9) {
    const int k = ++*rung;
    const double value = *value_at_rung(spec, rec, k);
    std::vector<double> values = judged_at(spec, k, records, id);
    values.push_back(value);
    const int n = static_cast<int>(values.size());
    const int top = std::max(1, n / spec.reduction_factor);
    if (rank_of(spec, value, values) >= top)
      return spec.metric + " " + value_text(value) + " at " +
             resource_text(spec, rung_resource(spec, k)) + " is not in the top " +
             std::to_string(top) + " of the " + std::to_string(n) + " run(s) at rung " +
             std::to_string(k) + " (pruner: asha, reduction_factor " +
             std::to_string(spec.reduction_factor) + ")";
  }
  return std::nullopt;
}

}  // namespace

std::string resource_text(const PrunerSpec& spec, double resource) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%s %.10g", spec.by_epoch ? "epoch" : "step", resource);
  return buf;
}

std::map<double, double> read_reports(const std::filesystem::path& metrics_csv,
                                      const PrunerSpec& spec, std::vector<std::string>* columns) {
  if (columns != nullptr) columns->clear();
  std::map<double, double> reports;
  std::ifstream file(metrics_csv, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  std::string whole = text.str();
  whole.resize(whole.rfind('\n') == std::string::npos ? 0 : whole.rfind('\n') + 1);  // whole lines
  std::istringstream in(whole);
  std::string line;
  if (!std::getline(in, line)) return reports;
  const std::vector<std::string> header = split_csv_line(line);
  if (columns != nullptr) *columns = header;
  const std::string axis = spec.by_epoch ? "epoch" : "step";
  const auto column = [&](const std::string& name) {
    return std::find(header.begin(), header.end(), name) - header.begin();
  };
  const size_t at_col = static_cast<size_t>(column(axis));
  const size_t value_col = static_cast<size_t>(column(spec.metric));
  if (at_col >= header.size() || value_col >= header.size()) return reports;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const std::vector<std::string> cells = split_csv_line(line);
    if (cells.size() != header.size()) continue;  // a row being written
    double at = 0, value = 0;
    if (!parse_number(cells[at_col], &at) || !parse_number(cells[value_col], &value)) continue;
    if (std::isfinite(at) && std::isfinite(value)) reports[at] = value;
  }
  return reports;
}

int rung_at(const PrunerSpec& spec, double resource) {
  int k = -1;
  while (rung_resource(spec, k + 1) <= resource + 1e-9) ++k;
  return k;
}

std::optional<std::string> decide(const PrunerSpec& spec, const std::string& id,
                                  const std::map<std::string, RunRecord>& records, int* rung) {
  auto it = records.find(id);
  if (spec.type.empty() || it == records.end() || it->second.reports.empty()) return std::nullopt;
  return spec.type == "median" ? decide_median(spec, id, records)
                               : decide_asha(spec, id, records, rung);
}

std::vector<std::string> promotable(const PrunerSpec& spec,
                                    const std::map<std::string, RunRecord>& records) {
  std::vector<std::pair<double, std::string>> found;
  if (spec.type != "asha") return {};
  for (const auto& [id, rec] : records) {
    if (rec.status != RunStatus::kPruned || rec.rung < 0) continue;
    const auto value = value_at_rung(spec, rec, rec.rung);
    if (!value) continue;
    const std::vector<double> values = judged_at(spec, rec.rung, records);
    const int top = static_cast<int>(values.size()) / spec.reduction_factor;
    if (rank_of(spec, *value, values) < top) found.emplace_back(*value, id);
  }
  std::stable_sort(found.begin(), found.end(),
                   [&](const auto& a, const auto& b) { return better(spec, a.first, b.first); });
  std::vector<std::string> ids;
  for (const auto& f : found) ids.push_back(f.second);
  return ids;
}

bool PruneWatch::read(const SweepRun& run, const std::filesystem::path& metrics_csv) {
  std::error_code ec, size_ec;
  const auto version = std::make_pair(std::filesystem::last_write_time(metrics_csv, ec),
                                      std::filesystem::file_size(metrics_csv, size_ec));
  if (ec || size_ec) return false;
  auto [seen, first] = read_at_.emplace(metrics_csv, version);
  if (!first && seen->second == version) return false;
  seen->second = version;
  RunRecord& rec = state_[run.id];
  bool changed = false;
  std::vector<std::string> columns;
  const auto reports = read_reports(metrics_csv, spec_, &columns);
  if (!columns.empty()) columns_[run.id] = {metrics_csv, columns};
  for (const auto& [at, value] : reports) {
    auto [it, inserted] = rec.reports.emplace(at, value);
    if (!inserted && it->second == value) continue;
    it->second = value;
    changed = true;
  }
  return changed;
}

std::optional<std::string> PruneWatch::verdict(const SweepRun& run) {
  if (external_) return external_(run, state_[run.id]);
  int rung = state_[run.id].rung;
  auto reason = decide(spec_, run.id, state_.runs(), &rung);
  state_[run.id].rung = rung;
  return reason;
}

std::optional<std::string> PruneWatch::take_warning() {
  if (warning_.empty()) return std::nullopt;
  std::string w;
  w.swap(warning_);
  return w;
}

void PruneWatch::ended(const SweepRun& run) {
  // A name the finished run never logged would leave the pruner without reports, deciding
  // nothing, in silence. Judged at the end: columns appear while a run goes (a metric logged at
  // evaluation only), so an early header may lack one the run logs later.
  if (auto it = columns_.find(run.id); !warned_ && it != columns_.end()) {
    const auto& [csv, columns] = it->second;
    const std::string axis = spec_.by_epoch ? "epoch" : "step";
    for (const std::string& want : {spec_.metric, axis}) {
      if (std::find(columns.begin(), columns.end(), want) != columns.end()) continue;
      warned_ = true;
      warning_ = "pruner: '" + want + "' is no column of " + csv.string() +
                 did_you_mean(want, columns) + " (its columns: " + join(columns) +
                 "); the pruner stops no run without it";
      break;
    }
  }
  RunRecord& rec = state_[run.id];
  if (spec_.type != "asha" || external_ || rec.reports.empty()) return;
  rec.rung = std::max(rec.rung, rung_at(spec_, rec.reports.rbegin()->first));
}

std::vector<std::string> PruneWatch::promotions() const {
  if (external_) return {};
  return promotable(spec_, state_.runs());
}

}  // namespace fabric::sweep
