// The type name a user writes for a module: the class name without its namespace or the "Impl"
// suffix of LibTorch's module holders ("torch::nn::BatchNorm2dImpl" → "BatchNorm2d",
// "fabric::nn::SyncBatchNormImpl" → "SyncBatchNorm"). Config keys that name module types
// (fabric.fsdp.wrap_modules, optimizer.no_weight_decay's type: selectors) compare against it.
#ifndef FABRIC_NN_MODULE_TYPE_H_
#define FABRIC_NN_MODULE_TYPE_H_

#include <string>

namespace fabric {

// `type` as Module::name() gives it (the demangled class name).
inline std::string module_type_stem(const std::string& type) {
  const size_t colon = type.rfind("::");
  std::string stem = type.substr(colon == std::string::npos ? 0 : colon + 2);
  if (stem.size() > 4 && stem.compare(stem.size() - 4, 4, "Impl") == 0)
    stem.resize(stem.size() - 4);
  return stem;
}

}  // namespace fabric

#endif  // FABRIC_NN_MODULE_TYPE_H_
