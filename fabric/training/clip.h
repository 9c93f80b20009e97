// Gradient clipping by total norm that leaves the norm on the device: no host synchronization, so
// a step that clips can be captured as a CUDA graph (fabric/graphed_step.h).
// Fabric::clip_gradients calls it and reads the returned norm on the host.
#ifndef FABRIC_TRAINING_CLIP_H_
#define FABRIC_TRAINING_CLIP_H_

#include <torch/types.h>

#include <vector>

namespace fabric {

// Scales the gradients of `parameters` so that their total `norm_type` norm is at most
// `max_norm` (parameters without a gradient are skipped) and returns the total norm before
// clipping as a 0-dim tensor on the gradients' device (0 when there are none). The arithmetic is
// LibTorch's torch::nn::utils::clip_grad_norm_ (norm_type inf and 0 included), so the clipped
// gradients are bitwise the same.
torch::Tensor clip_grad_norm_on_device(const std::vector<torch::Tensor>& parameters,
                                       double max_norm, double norm_type = 2.0);

}  // namespace fabric

#endif  // FABRIC_TRAINING_CLIP_H_
