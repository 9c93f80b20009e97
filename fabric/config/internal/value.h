// Internal: checking one YAML value against a KeySpec (shared by schema defaults and loading).
#ifndef FABRIC_CONFIG_INTERNAL_VALUE_H_
#define FABRIC_CONFIG_INTERNAL_VALUE_H_

#include <yaml-cpp/yaml.h>

#include <string>

#include "fabric/config/schema.h"

namespace fabric::internal {

struct Normalized {
  YAML::Node value;   // canonical form (aliases resolved, numbers typed) when error is empty
  std::string error;  // "'16-mixd' is not a precision; did you mean '16-mixed'? (one of ...)"
};

Normalized normalize_value(const KeySpec& spec, const YAML::Node& value);

// Shortest text that reads back as the same double ("0.1", "65536", "1e-08").
std::string format_double(double value);

// How a value appears in messages: scalars quoted ('abc'), other nodes as flow YAML; always one
// line (control characters escaped as \n, \t, \xNN) of at most 80 characters (then "...").
std::string describe(const YAML::Node& value);

}  // namespace fabric::internal

#endif  // FABRIC_CONFIG_INTERNAL_VALUE_H_
