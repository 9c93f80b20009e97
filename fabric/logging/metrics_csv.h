// fabric::CsvMetrics: metrics.csv of a run, one row per logged step, one column per metric name.
//
//   step,train/loss,lr,test/accuracy
//   50,1.93,0.1,
//   100,1.61,0.099,0.42
//
// Columns appear in the order names are first logged (names of one call in alphabetical order); a
// row leaves the metrics it lacks empty.
// Values logged for the same step are merged into one row (a later value of a name replaces an
// earlier one). A row is written once a later step is logged (or at flush()/destruction); a new
// name rewrites the file with the wider header (crash-safe: temporary file and rename), so the
// file is always a valid CSV that pandas and spreadsheets read directly.
//
// Not thread-safe: one writer per run, used by global rank 0 (Fabric::log).
#ifndef FABRIC_LOGGING_METRICS_CSV_H_
#define FABRIC_LOGGING_METRICS_CSV_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fabric/logging/logger.h"

namespace fabric {

class CsvMetrics : public MetricLogger {
 public:
  // Starts an empty metrics file at `path`. Throws fabric::Error "cannot write PATH: ...".
  explicit CsvMetrics(std::filesystem::path path);
  ~CsvMetrics() override;  // flushes (errors are printed, not thrown)
  CsvMetrics(const CsvMetrics&) = delete;
  CsvMetrics& operator=(const CsvMetrics&) = delete;

  // Records `values` at `step`. Throws fabric::Error for an empty name, a name with a comma,
  // quote or newline, or a step smaller than the previous one.
  void log(const std::map<std::string, double>& values, int64_t step) override;
  // Writes the pending row. Throws fabric::Error "cannot write PATH: ...".
  void flush() override;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::string row_text(int64_t step, const std::map<std::string, double>& values) const;
  void rewrite();

  std::filesystem::path path_;
  std::vector<std::string> columns_;
  std::map<std::string, size_t> column_of_;
  std::vector<std::string> rows_;  // written rows (kept to rewrite under a wider header)
  int64_t pending_step_ = -1;
  std::map<std::string, double> pending_;
  bool header_changed_ = false;
};

}  // namespace fabric

#endif  // FABRIC_LOGGING_METRICS_CSV_H_
