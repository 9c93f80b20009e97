// Parameter groups from rules: which parameters train without weight decay and which learn at a
// scaled rate (config keys optimizer.no_weight_decay and optimizer.lr_scale; make_optimizer).
//
// A selector names parameters in one of two forms:
//   GLOB        the parameter's dotted name as named_parameters() gives it ("layer1.0.bn1.weight"):
//               "*.bias", "fc.*", "layer4.*"; * matches any run of characters, dots included, ? one
//   type:GLOB   parameters held directly by a module of that type, written without namespace or
//               Impl suffix: "type:*Norm*" (BatchNorm2d, SyncBatchNorm, LayerNorm, GroupNorm),
//               "type:Linear"
// A selector that matches no parameter is an error (a typo would otherwise change nothing).
//
// Groups: parameters are partitioned by (learning-rate scale, weight decay on/off); the group of
// unmatched parameters (scale 1, decay on) comes first when it is not empty, then the others in the
// order their first parameter appears. Within a group, parameters keep the module's order. For
// lr_scale, the first rule a parameter matches decides.
//
// Example (the usual "no decay for biases and norms", and a head at 10× the rate):
//   fabric::ParamGroupRules rules;
//   rules.no_weight_decay = {"*.bias", "type:*Norm*"};
//   rules.lr_scale = {{"fc.*", 10.0}};
//   for (const auto& g : fabric::group_parameters(*model, rules)) ... g.params, g.lr_scale, ...
#ifndef FABRIC_TRAINING_PARAM_GROUPS_H_
#define FABRIC_TRAINING_PARAM_GROUPS_H_

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

namespace fabric {

struct ParamGroupRules {
  std::vector<std::string> no_weight_decay;              // selectors
  std::vector<std::pair<std::string, double>> lr_scale;  // (selector, factor > 0)
  bool empty() const { return no_weight_decay.empty() && lr_scale.empty(); }
};

struct ParamGroup {
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;  // dotted names, parallel to params
  double lr_scale = 1.0;
  bool weight_decay = true;
};

// Every parameter of `module` (each tensor once) in its group. Throws fabric::Error naming the
// selector when one matches nothing, with an example of the module's parameter names; with
// `require_matches` false (a part of a model, a pipeline stage, whose selectors were checked
// against the whole) a selector may match nothing.
std::vector<ParamGroup> group_parameters(const torch::nn::Module& module,
                                         const ParamGroupRules& rules, bool require_matches = true);

// True when `selector` (either form above) selects the parameter `name` held by a module whose
// Module::name() is `module_type`.
bool selector_matches(const std::string& selector, const std::string& name,
                      const std::string& module_type);

// "SELECTOR=FACTOR" (the optimizer.lr_scale config form) → (selector, factor). Throws
// fabric::Error unless FACTOR is a number > 0 and SELECTOR is not empty.
std::pair<std::string, double> parse_lr_scale(const std::string& text);

}  // namespace fabric

#endif  // FABRIC_TRAINING_PARAM_GROUPS_H_
