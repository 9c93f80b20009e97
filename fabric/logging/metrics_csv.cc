#include "fabric/logging/metrics_csv.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "fabric/core/atomic_file.h"
#include "fabric/core/error.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

}  // namespace

CsvMetrics::CsvMetrics(fs::path path) : path_(std::move(path)) { rewrite(); }

CsvMetrics::~CsvMetrics() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::cerr << "warning: " << e.what() << std::endl;
  }
}

void CsvMetrics::log(const std::map<std::string, double>& values, int64_t step) {
  for (const auto& [name, v] : values)
    if (name.empty() || name.find_first_of(",\"\n\r") != std::string::npos)
      throw Error("metrics: the name '" + name +
                  "' cannot be a CSV column (empty, or has a comma, quote or newline)");
  if (step < pending_step_)
    throw Error("metrics: step " + std::to_string(step) + " logged after step " +
                std::to_string(pending_step_) + "; steps must not decrease");
  if (step != pending_step_) flush();
  pending_step_ = step;
  for (const auto& [name, v] : values) {
    pending_[name] = v;
    if (column_of_.emplace(name, columns_.size()).second) {
      columns_.push_back(name);
      header_changed_ = true;
    }
  }
}

std::string CsvMetrics::row_text(int64_t step, const std::map<std::string, double>& values) const {
  std::vector<std::string> cells(columns_.size());
  for (const auto& [name, v] : values) cells[column_of_.at(name)] = number(v);
  std::string row = std::to_string(step);
  for (const auto& c : cells) row += "," + c;
  return row + "\n";
}

void CsvMetrics::flush() {
  if (pending_.empty()) return;
  std::string row = row_text(pending_step_, pending_);
  pending_.clear();
  if (header_changed_) {
    // Earlier rows get the new (empty) trailing cells.
    for (auto& r : rows_)
      r.insert(r.size() - 1,
               std::string(columns_.size() - std::count(r.begin(), r.end(), ','), ','));
    rows_.push_back(std::move(row));
    rewrite();
    header_changed_ = false;
    return;
  }
  std::ofstream out(path_, std::ios::app);
  out << row;
  out.flush();
  if (!out) throw Error("cannot write " + path_.string() + ": append failed");
  rows_.push_back(std::move(row));
}

void CsvMetrics::rewrite() {
  std::string text = "step";
  for (const auto& c : columns_) text += "," + c;
  text += "\n";
  for (const auto& r : rows_) text += r;
  write_file_atomically(path_, text);
}

}  // namespace fabric
