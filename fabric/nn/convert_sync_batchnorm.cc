// convert_sync_batchnorm: walks a module tree, hands the process group to fabric BatchNorms and
// swaps torch BatchNorms held by containers for fabric ones.
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>

#include "fabric/core/error.h"
#include "fabric/nn/batch_norm.h"

namespace fabric::nn {
namespace {

using ModulePtr = std::shared_ptr<torch::nn::Module>;

// A fabric BatchNorm of the same dimension and options as `module` (a torch BatchNorm) that took
// over its state; null if `module` is not a torch BatchNorm.
template <typename TorchImpl, typename FabricImpl>
std::shared_ptr<FabricImpl> replacement_for(const ModulePtr& module) {
  auto old = std::dynamic_pointer_cast<TorchImpl>(module);
  if (!old) return nullptr;
  auto fresh = std::make_shared<FabricImpl>(old->options);
  fresh->adopt(*old);
  return fresh;
}

// Sets the group on a fabric BatchNorm; false if `module` is not one.
template <typename FabricImpl>
bool set_group(const ModulePtr& module, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  auto bn = std::dynamic_pointer_cast<FabricImpl>(module);
  if (bn) bn->set_process_group(group);
  return bn != nullptr;
}

// Puts `fresh` in place of child `name` (the `index`-th child) of container `parent`; false if
// `parent` is not a Sequential, ModuleList or ModuleDict.
template <typename FabricImpl>
bool replace_in_container(torch::nn::Module& parent, const std::string& name, size_t index,
                          const std::shared_ptr<FabricImpl>& fresh) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    *(seq->begin() + static_cast<std::ptrdiff_t>(index)) = torch::nn::AnyModule(fresh);
    seq->replace_module(name, fresh);
    return true;
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    *(list->begin() + static_cast<std::ptrdiff_t>(index)) = fresh;
    list->replace_module(name, fresh);
    return true;
  }
  if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    dict->update(std::vector<std::pair<std::string, ModulePtr>>{{name, fresh}});
    return true;
  }
  return false;
}

template <typename TorchImpl, typename FabricImpl>
bool try_replace(torch::nn::Module& parent, const std::string& name, size_t index,
                 const ModulePtr& child, const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                 bool& replaced) {
  if (!std::dynamic_pointer_cast<TorchImpl>(child)) return false;
  auto fresh = replacement_for<TorchImpl, FabricImpl>(child);
  fresh->set_process_group(group);
  replaced = replace_in_container(parent, name, index, fresh);
  return true;
}

void convert(torch::nn::Module& module, const std::string& prefix,
             const c10::intrusive_ptr<c10d::ProcessGroup>& group, SyncBatchNormReport& report) {
  const auto children = module.named_children();
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string& name = children[i].key();
    const ModulePtr& child = children[i].value();
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    if (set_group<BatchNorm1dImpl>(child, group) || set_group<BatchNorm2dImpl>(child, group) ||
        set_group<BatchNorm3dImpl>(child, group)) {
      report.synchronized.push_back(path);
      continue;
    }
    bool replaced = false;
    if (try_replace<torch::nn::BatchNorm1dImpl, BatchNorm1dImpl>(module, name, i, child, group,
                                                                 replaced) ||
        try_replace<torch::nn::BatchNorm2dImpl, BatchNorm2dImpl>(module, name, i, child, group,
                                                                 replaced) ||
        try_replace<torch::nn::BatchNorm3dImpl, BatchNorm3dImpl>(module, name, i, child, group,
                                                                 replaced)) {
      (replaced ? report.synchronized : report.not_replaceable).push_back(path);
      continue;
    }
    convert(*child, path, group, report);
  }
}

}  // namespace

SyncBatchNormReport convert_sync_batchnorm(torch::nn::Module& root,
                                           const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  SyncBatchNormReport report;
  convert(root, "", group, report);
  return report;
}

SyncBatchNormReport convert_sync_batchnorm_or_throw(
    torch::nn::Module& root, const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  SyncBatchNormReport report = convert_sync_batchnorm(root, group);
  if (report.not_replaceable.empty()) return report;
  std::string paths;
  for (const auto& p : report.not_replaceable) paths += (paths.empty() ? "'" : ", '") + p + "'";
  throw Error("fabric.sync_batchnorm: cannot synchronize the torch::nn::BatchNorm at " + paths +
              " (a plain member of your module, so it cannot be swapped); declare it as "
              "fabric::nn::BatchNorm1d/2d/3d (same options and state_dict keys, "
              "#include \"fabric/nn/batch_norm.h\") or hold it in a torch::nn::Sequential");
}

}  // namespace fabric::nn
