// The YAML side of reading a sweep file (tools/sweep/spec.cc): a Parser whose every problem
// is one ConfigError "FILE:LINE:COL: KEY: problem; fix", a value's YAML text, and the parsers of
// the `space:` distributions and the `pruner:` section. Internal to //tools/sweep:lib.
#ifndef TOOLS_SWEEP_YAML_H_
#define TOOLS_SWEEP_YAML_H_

#include <yaml-cpp/yaml.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>

#include "fabric/config/yaml_load.h"
#include "fabric/core/error.h"
#include "tools/sweep/space.h"
#include "tools/sweep/spec.h"

namespace fabric::sweep {

// The largest count a sweep file may give (parallel, devices_per_run, pruner: reduction_factor,
// min_runs): far beyond any machine, well inside an int.
constexpr int64_t kMaxCount = 1000000;

class Parser {
 public:
  Parser(std::string file) : file_(std::move(file)) {}

  std::string at(const YAML::Node& node) const { return yaml_location(file_, node.Mark()); }
  [[noreturn]] void fail(const YAML::Node& node, const std::string& message) const {
    throw ConfigError(at(node) + ": " + message);
  }

  std::string scalar(const YAML::Node& node, const std::string& key) const {
    if (!node.IsScalar()) fail(node, key + ": expected a single value");
    return node.Scalar();
  }
  // An integer in [min, max] (counts that become an int: max kMaxCount).
  int64_t integer(const YAML::Node& node, const std::string& key, int64_t min,
                  int64_t max = INT64_MAX) const {
    const std::string text = scalar(node, key);
    int64_t value = 0;
    size_t used = 0;
    try {
      value = std::stoll(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size()) fail(node, key + ": '" + text + "' is not an integer");
    if (value < min)
      fail(node, key + ": " + text + " is out of range: must be >= " + std::to_string(min));
    if (value > max)
      fail(node, key + ": " + text + " is out of range: must be <= " + std::to_string(max));
    return value;
  }
  double number(const YAML::Node& node, const std::string& key) const {
    const std::string text = scalar(node, key);
    double value = 0;
    size_t used = 0;
    try {
      value = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != text.size() || !std::isfinite(value))
      fail(node, key + ": '" + text + "' is not a number");
    return value;
  }
  bool boolean(const YAML::Node& node, const std::string& key) const {
    const std::string text = scalar(node, key);
    if (text == "true") return true;
    if (text == "false") return false;
    fail(node, key + ": '" + text + "' is not a boolean: write true or false");
  }

  // key → value text of a mapping of overrides (grid values are sequences, checked by the caller).
  void check_key(const YAML::Node& key_node, const std::string& where) const {
    const std::string key = scalar(key_node, where);
    if (key.find('.') == std::string::npos || key.front() == '.' || key.back() == '.')
      fail(key_node, where + ": '" + key + "' is not a config key like 'optimizer.lr'");
  }

 private:
  std::string file_;
};

// YAML text of a value, for `key=value` on the command line ("0.1", "[0.9, 0.99]", "'a b'").
std::string value_text(const YAML::Node& node);

// One distribution of `space:` (`node`: a list of choices or {kind: args}); `where` is
// "space: KEY" for messages.
Distribution parse_distribution(const Parser& p, const YAML::Node& node, const std::string& where);

// The `pruner:` mapping; its mode defaults to the sweep's (`sweep_maximizes`).
PrunerSpec parse_pruner(const Parser& p, const YAML::Node& node, bool sweep_maximizes);

}  // namespace fabric::sweep

#endif  // TOOLS_SWEEP_YAML_H_
