// fabric::Loggers: where Fabric::log's values go, behind one object. It hands each call to every
// MetricLogger (logger.h) in the order they were added: the built-in ones chosen by
// logging.loggers, then those added with Fabric::add_logger.
//
// Not thread-safe: used by global rank 0 from the thread that runs Fabric::launch.
#ifndef FABRIC_LOGGING_LOGGERS_H_
#define FABRIC_LOGGING_LOGGERS_H_

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fabric/logging/logger.h"

namespace fabric {

class Loggers {
 public:
  Loggers();
  ~Loggers();
  Loggers(const Loggers&) = delete;
  Loggers& operator=(const Loggers&) = delete;

  // Replaces the built-in loggers by those named in `names` (logging.loggers: csv, tensorboard),
  // writing into the run directory `dir`; added loggers stay. Throws fabric::Error for another
  // name or a file that cannot be written (the previous built-in loggers are gone then).
  void open_built_in(const std::vector<std::string>& names, const std::filesystem::path& dir);
  void add(std::unique_ptr<MetricLogger> logger);

  // Every logger's log(), built-in ones first, then added ones in the order they were added.
  void log(const std::map<std::string, double>& values, int64_t step);
  void flush();
  size_t size() const { return built_in_.size() + added_.size(); }

 private:
  std::vector<std::unique_ptr<MetricLogger>> built_in_;
  std::vector<std::unique_ptr<MetricLogger>> added_;
};

}  // namespace fabric

#endif  // FABRIC_LOGGING_LOGGERS_H_
