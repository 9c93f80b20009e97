#include "fabric/training/clip.h"

#include <torch/types.h>

#include <limits>

namespace fabric {

torch::Tensor clip_grad_norm_on_device(const std::vector<torch::Tensor>& parameters,
                                       double max_norm, double norm_type) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : parameters)
    if (p.grad().defined()) grads.push_back(p.grad().data());
  if (grads.empty()) return torch::zeros({});

  torch::Tensor total;
  if (norm_type == std::numeric_limits<double>::infinity()) {
    std::vector<torch::Tensor> norms;
    norms.reserve(grads.size());
    for (const auto& g : grads) norms.push_back(g.abs().max());
    total = norms.size() == 1 ? norms[0] : torch::max(torch::stack(norms));
  } else if (norm_type == 0) {
    // The count of gradients, as LibTorch computes it (default dtype), made on their device.
    total = torch::full({}, static_cast<double>(grads.size()),
                        torch::TensorOptions().device(grads[0].device()));
  } else {
    std::vector<torch::Tensor> norms;
    norms.reserve(grads.size());
    for (const auto& g : grads) norms.push_back(g.norm(norm_type));
    total = norms.size() == 1 ? norms[0] : torch::stack(norms).norm(norm_type);
  }
  const torch::Tensor coefficient =
      torch::clamp(max_norm / (total + 1e-6), /*min=*/std::nullopt, /*max=*/1.0);
  for (auto& g : grads) g.mul_(coefficient);
  return total;
}

}  // namespace fabric
