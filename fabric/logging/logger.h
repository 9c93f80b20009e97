// fabric::MetricLogger: receives every step's logged values (name → value) from Fabric::log.
//
// The built-in ones are CsvMetrics (metrics.csv, metrics_csv.h) and TensorBoardScalars (an event
// file, tensorboard.h), chosen by logging.loggers; Fabric::add_logger adds your own, e.g. one that
// sends values to an experiment tracker. Called on global rank 0 only, from the thread that runs
// Fabric::launch.
#ifndef FABRIC_LOGGING_LOGGER_H_
#define FABRIC_LOGGING_LOGGER_H_

#include <cstdint>
#include <map>
#include <string>

namespace fabric {

class MetricLogger {
 public:
  virtual ~MetricLogger() = default;
  // The values of `step`; a logger may merge several calls for the same step. Throws
  // fabric::Error when it cannot record them.
  virtual void log(const std::map<std::string, double>& values, int64_t step) = 0;
  // Makes what was logged durable/visible (end of the run; Fabric calls it after the user's
  // function returns).
  virtual void flush() {}
};

}  // namespace fabric

#endif  // FABRIC_LOGGING_LOGGER_H_
