// Helpers for the Connector's tests (connector_test, connector_cpu_test): replaceable machine
// facts and resolving a config of command-line overrides against them.
#ifndef TESTS_FABRIC_CONNECTOR_TESTING_H_
#define TESTS_FABRIC_CONNECTOR_TESTING_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fabric/connector.h"

namespace fabric::testing {

inline MachineFacts facts(bool cuda_compiled, bool libtorch_has_cuda, int64_t devices, bool bf16,
                          const std::string& visible) {
  MachineFacts m;
  m.cuda_compiled = cuda_compiled;
  m.libtorch_has_cuda = libtorch_has_cuda;
  m.cuda_device_count = devices;
  m.cuda_bf16_supported = bf16;
  m.cuda_visible_devices = visible;
  return m;
}

inline MachineFacts cpu_machine() { return facts(false, false, 0, false, ""); }
inline MachineFacts gpu_machine(int64_t n, bool bf16 = true) {
  return facts(true, true, n, bf16, "");
}

inline fabric::ResolvedSetup resolve(const std::vector<std::string>& overrides,
                                     const MachineFacts& m) {
  return fabric::resolve_setup(fabric::Config::defaults(fabric::training_schema(), overrides), m);
}

inline std::string error_of(const std::vector<std::string>& overrides, const MachineFacts& m) {
  try {
    resolve(overrides, m);
  } catch (const fabric::ConfigError& e) {
    return e.what();
  }
  return "";
}

inline fabric::EnvGetter env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

}  // namespace fabric::testing

#endif  // TESTS_FABRIC_CONNECTOR_TESTING_H_
