// Fabric++: see tools/bazel/gloo_declarations/README.md.
#pragma once

#include <chrono>

namespace gloo {

// Only what ProcessGroupGloo.hpp's inline code names; never instantiated by Fabric++.
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

}  // namespace gloo
