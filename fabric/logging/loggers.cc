#include "fabric/logging/loggers.h"

#include <utility>

#include "fabric/core/error.h"
#include "fabric/logging/metrics_csv.h"
#include "fabric/logging/tensorboard.h"

namespace fabric {

Loggers::Loggers() = default;
Loggers::~Loggers() = default;

void Loggers::open_built_in(const std::vector<std::string>& names,
                            const std::filesystem::path& dir) {
  built_in_.clear();
  for (const std::string& name : names) {
    if (name == "csv") {
      built_in_.push_back(std::make_unique<CsvMetrics>(dir / "metrics.csv"));
    } else if (name == "tensorboard") {
      built_in_.push_back(std::make_unique<TensorBoardScalars>(dir));
    } else {
      throw Error("logging.loggers: '" + name + "' is not a logger (csv, tensorboard)");
    }
  }
}

void Loggers::add(std::unique_ptr<MetricLogger> logger) {
  if (!logger) throw Error("Fabric::add_logger: null logger");
  added_.push_back(std::move(logger));
}

void Loggers::log(const std::map<std::string, double>& values, int64_t step) {
  for (auto& logger : built_in_) logger->log(values, step);
  for (auto& logger : added_) logger->log(values, step);
}

void Loggers::flush() {
  for (auto& logger : built_in_) logger->flush();
  for (auto& logger : added_) logger->flush();
}

}  // namespace fabric
