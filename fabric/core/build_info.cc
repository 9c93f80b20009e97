#include "fabric/core/build_info.h"

#include <torch/headeronly/version.h>

#include "fabric/core/internal/revision.h"

namespace fabric {
namespace internal {

// Weak default; //fabric/core:stamp (alwayslink) supplies the stamped definition for binaries.
__attribute__((weak)) const char* project_revision() { return "unstamped"; }

}  // namespace internal

namespace {

std::string compiler_name() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

BuildInfo make_build_info() {
  BuildInfo info;
  info.revision = internal::project_revision();
  info.compiler = compiler_name();
  info.cxx_standard = __cplusplus;
#ifdef _GLIBCXX_USE_CXX11_ABI
  info.cxx11_abi = _GLIBCXX_USE_CXX11_ABI;
#endif
  info.libtorch_headers = std::to_string(TORCH_VERSION_MAJOR) + "." +
                          std::to_string(TORCH_VERSION_MINOR) + "." +
                          std::to_string(TORCH_VERSION_PATCH);
#ifdef FABRIC_WITH_CUDA
  info.cuda_compiled = true;
#endif
#ifdef NDEBUG
  info.optimized = true;
#endif
  return info;
}

}  // namespace

const BuildInfo& build_info() {
  static const BuildInfo info = make_build_info();
  return info;
}

}  // namespace fabric
