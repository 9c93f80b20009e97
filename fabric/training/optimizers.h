// Optimizers from the `optimizer:` config section (fabric::training_schema()):
//   sgd    lr, momentum, nesterov, weight_decay
//   adam   lr, betas, eps, weight_decay (L2, added to the gradient)
//   adamw  lr, betas, eps, weight_decay (decoupled)
// and implementation (auto | fused | foreach | for_loop): fabric::SGD / Adam / AdamW
// (fabric/training/fast_optimizers.h), torch::optim's optimizers with a faster step; for_loop is
// torch::optim's own loop.
// Parameter groups (fabric/training/param_groups.h) from two keys, given the module:
//   no_weight_decay  selectors of parameters trained with weight decay 0, e.g. ["*.bias",
//                    "type:*Norm*"]
//   lr_scale         "SELECTOR=FACTOR" entries: those parameters learn at FACTOR × the rate (the
//                    LRScheduler keeps each group's ratio), e.g. ["fc.*=10"]
// With neither, the optimizer has one group of every parameter.
#ifndef FABRIC_TRAINING_OPTIMIZERS_H_
#define FABRIC_TRAINING_OPTIMIZERS_H_

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "fabric/config/config.h"
#include "fabric/training/fast_optimizers.h"
#include "fabric/training/param_groups.h"

namespace fabric {

// The optimizer for `module`'s parameters, grouped by optimizer.no_weight_decay and
// optimizer.lr_scale. Throws ConfigError naming the key: nesterov without momentum, a malformed
// lr_scale entry, a selector that matches no parameter.
//   auto optimizer = fabric::make_optimizer(config, *model);
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& config,
                                                        const torch::nn::Module& module);

// The same for a part of a model (a pipeline stage's module): a selector may match nothing here,
// having been checked against the whole model with check_param_group_rules.
std::unique_ptr<torch::optim::Optimizer> make_optimizer_for_part(const Config& config,
                                                                 const torch::nn::Module& part);

// ConfigError naming optimizer.no_weight_decay or optimizer.lr_scale when one of its selectors
// matches no parameter of `module` (make_optimizer's check, without making an optimizer).
void check_param_group_rules(const Config& config, const torch::nn::Module& module);

// One group of `parameters` (no names, so the two group keys must be empty: ConfigError if not).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& config,
                                                        std::vector<torch::Tensor> parameters);

// The rules of optimizer.no_weight_decay and optimizer.lr_scale. Throws ConfigError for a malformed
// lr_scale entry.
ParamGroupRules param_group_rules(const Config& config);

}  // namespace fabric

#endif  // FABRIC_TRAINING_OPTIMIZERS_H_
