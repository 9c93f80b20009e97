// Fabric++: see tools/bazel/gloo_declarations/README.md. The interface ProcessGroupGloo::GlooStore
// overrides (without GLOO_STORE_HAS_STORE_V2, whose extra methods we leave undeclared).
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gloo::rendezvous {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::vector<char>& data) = 0;
  virtual std::vector<char> get(const std::string& key) = 0;
  virtual void wait(const std::vector<std::string>& keys) = 0;
  virtual void wait(const std::vector<std::string>& keys,
                    const std::chrono::milliseconds& timeout) = 0;
};

}  // namespace gloo::rendezvous
