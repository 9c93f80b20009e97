// fabric::Error: the one exception type for configuration and API misuse.
//
// The message says what was given, why it is wrong and what to do, on one line, e.g.
//   configs/ddp.yaml:7:14: fabric.precision: '16-mixd' is not a precision; did you mean '16-mixed'?
// Expected absences are values (std::optional), never exceptions. Library code never calls exit().
#ifndef FABRIC_CORE_ERROR_H_
#define FABRIC_CORE_ERROR_H_

#include <stdexcept>
#include <string>

namespace fabric {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A bad config file, override or command-line flag. Programs exit with status 2 on it
// (fabric::run_main does this), printing only the message: "FILE:LINE:COL: KEY: problem; fix".
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(message) {}
};

}  // namespace fabric

#endif  // FABRIC_CORE_ERROR_H_
