// fabric::TensorBoardScalars: scalar summaries in TensorBoard's event file format, so
// `tensorboard --logdir <run dir>` plots what Fabric::log records.
//
// The file <dir>/events.out.tfevents.<unix time>.<host>.<pid>.0 is a TFRecord stream (length,
// masked CRC-32C of the length, data, masked CRC-32C of the data) of Event protocol buffers
// (tensorflow/core/util/event.proto): first {wall_time, file_version: "brain.Event:2"}, then one
// {wall_time, step, summary {value {tag, simple_value}}} per log call. The few protobuf fields are
// encoded here (varints, fixed64/fixed32, length-delimited); TensorBoard's own reader is the judge
// (//tests/fabric/logging:tensorboard_test reads the files with the `tensorboard` Python package).
//
// Events are flushed to the OS after every call (rank 0 logs a few times per second at most).
// Not thread-safe: one writer per run, used by global rank 0 (Fabric::log).
#ifndef FABRIC_LOGGING_TENSORBOARD_H_
#define FABRIC_LOGGING_TENSORBOARD_H_

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>

#include "fabric/logging/logger.h"

namespace fabric {

class TensorBoardScalars : public MetricLogger {
 public:
  // Creates the event file in `dir` (which must exist). Throws fabric::Error "cannot write ...".
  explicit TensorBoardScalars(const std::filesystem::path& dir);
  ~TensorBoardScalars() override;
  TensorBoardScalars(const TensorBoardScalars&) = delete;
  TensorBoardScalars& operator=(const TensorBoardScalars&) = delete;

  // One event holding every value as a scalar summary (tag = name) at `step`. Throws
  // fabric::Error "cannot write PATH: ..." when the write fails.
  void log(const std::map<std::string, double>& values, int64_t step) override;

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(std::string_view data);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// CRC-32C (Castagnoli) of `data`, as TFRecord framing uses it (before masking). Exposed for tests.
uint32_t crc32c(std::string_view data);

}  // namespace fabric

#endif  // FABRIC_LOGGING_TENSORBOARD_H_
