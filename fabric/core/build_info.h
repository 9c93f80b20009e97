// fabric::BuildInfo: facts fixed when this binary was built (compiler, ABI, LibTorch headers,
// project revision). Cheap to call; thread-safe.
//
// Example:
//   LOG(INFO) << "fabric " << fabric::build_info().revision;
#ifndef FABRIC_CORE_BUILD_INFO_H_
#define FABRIC_CORE_BUILD_INFO_H_

#include <string>

namespace fabric {

struct BuildInfo {
  // Git revision of the project the binary was built from (12 hex digits, "-dirty" when the tree
  // had uncommitted changes), or "unstamped" for binaries that do not link //fabric/core:stamp
  // (tests, so that a commit does not invalidate every cached test result).
  std::string revision;
  std::string compiler;          // e.g. "gcc 12.2.0".
  long cxx_standard = 0;         // __cplusplus, e.g. 202002.
  int cxx11_abi = -1;            // _GLIBCXX_USE_CXX11_ABI the code was compiled with.
  std::string libtorch_headers;  // LibTorch version of the headers compiled against, e.g. "2.11.0".
  bool cuda_compiled =
      false;               // FABRIC_WITH_CUDA was defined (not --config=cpu_only, CUDA LibTorch).
  bool optimized = false;  // compiled with optimization (NDEBUG).
};

const BuildInfo& build_info();

}  // namespace fabric

#endif  // FABRIC_CORE_BUILD_INFO_H_
