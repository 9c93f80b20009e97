// fabric::Error: the one exception type for configuration and API misuse.
//
// The message says what was given, why it is wrong and what to do, on one line, e.g.
//   configs/ddp.yaml:7:14: fabric.precision: '16-mixd' is not a precision; did you mean '16-mixed'?
// Expected absences are values (std::optional), never exceptions. Library code never calls exit().
#ifndef FABRIC_CORE_ERROR_H_
#define FABRIC_CORE_ERROR_H_

#include <cstddef>
#include <stdexcept>
#include <string>

namespace fabric {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// `text` on one line: control characters escaped (\n, \t, \xNN); with `max_chars`, cut after
// that many characters, then "...". For quoting user input in messages.
std::string one_line(const std::string& text, std::size_t max_chars = std::string::npos);

// A bad config file, override or command-line flag. Programs exit with status 2 on it
// (fabric::run_main does this), printing only the message: "FILE:LINE:COL: KEY: problem; fix".
// (Its message is made one line by one_line(): any quoted input can hold newlines.)
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& message) : Error(one_line(message)) {}
};

// A std::exception's message in the project's terms, for the one line a program ends with. A
// std::filesystem error ("filesystem error: cannot create directories: Not a directory [P]")
// becomes "cannot create directories P: Not a directory"; other messages are kept.
std::string describe(const std::exception& e);

// The status of a launcher of our CUDA kernels (0, or a cudaError_t): otherwise throws Error
// "WHAT: the CUDA kernel (KERNEL) failed to launch (cudaError N); was Fabric++ built for this
// GPU's architecture?".
void check_kernel_launch(int status, const std::string& what, const std::string& kernel);

}  // namespace fabric

#endif  // FABRIC_CORE_ERROR_H_
