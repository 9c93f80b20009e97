// Optimizers from the `optimizer:` config section (fabric::training_schema()):
//   sgd    lr, momentum, nesterov, weight_decay
//   adam   lr, betas, eps, weight_decay (L2, added to the gradient)
//   adamw  lr, betas, eps, weight_decay (decoupled)
// and implementation (auto | fused | foreach | for_loop): fabric::SGD / Adam / AdamW
// (fabric/training/fast_optimizers.h), torch::optim's optimizers with a faster step; for_loop is
// torch::optim's own loop.
#ifndef FABRIC_TRAINING_OPTIMIZERS_H_
#define FABRIC_TRAINING_OPTIMIZERS_H_

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "fabric/config/config.h"
#include "fabric/training/fast_optimizers.h"

namespace fabric {

// Throws ConfigError (at optimizer.nesterov) for nesterov without momentum.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& config,
                                                        std::vector<torch::Tensor> parameters);

}  // namespace fabric

#endif  // FABRIC_TRAINING_OPTIMIZERS_H_
