#include "fabric/training/state_bytes.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <set>
#include <vector>

#include "fabric/checkpoint/optimizer_state.h"

namespace fabric {
namespace {

int64_t storage_bytes(const std::vector<torch::Tensor>& tensors) {
  std::set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& t : tensors)
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second)
      bytes += static_cast<int64_t>(t.storage().nbytes());
  return bytes;
}

}  // namespace

StateBytes state_bytes(const torch::nn::Module& module, const torch::optim::Optimizer& optimizer) {
  std::vector<torch::Tensor> params = module.parameters(), grads, state;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) params.push_back(p);
  for (const auto& p : params) grads.push_back(p.grad());
  const auto saved = optimizer_state(optimizer).toGenericDict().at("state").toGenericDict();
  for (const auto& entry : saved)
    for (const auto& field : entry.value().toGenericDict())
      if (field.value().isTensor()) state.push_back(field.value().toTensor());
  return {storage_bytes(params), storage_bytes(grads), storage_bytes(state)};
}

int64_t optimizer_state_bytes_expected(const torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  for (const auto& group : optimizer.param_groups()) {
    const auto& o = group.options();
    int64_t per = 2;
    if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&o)) {
      per = sgd->momentum() != 0 ? 1 : 0;
    } else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&o)) {
      per = adam->amsgrad() ? 3 : 2;
    } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&o)) {
      per = adamw->amsgrad() ? 3 : 2;
    }
    for (const auto& p : group.params()) bytes += per * p.numel() * p.element_size();
  }
  return bytes;
}

}  // namespace fabric
