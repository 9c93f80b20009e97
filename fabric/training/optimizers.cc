#include "fabric/training/optimizers.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "fabric/training/param_groups.h"

namespace fabric {
namespace {

// One group of every parameter (no rules), or the rule groups with each its own options: the rate
// times its scale, and weight decay 0 where the rules exempt it.
template <typename Optim, typename Options>
std::unique_ptr<torch::optim::Optimizer> build(const Options& options, OptimizerImpl impl,
                                               std::vector<torch::Tensor> parameters,
                                               const std::vector<ParamGroup>* groups) {
  if (groups == nullptr) return std::make_unique<Optim>(std::move(parameters), options, impl);
  std::vector<torch::optim::OptimizerParamGroup> out;
  for (const ParamGroup& g : *groups) {
    auto o = std::make_unique<Options>(options);
    o->lr(options.lr() * g.lr_scale);
    if (!g.weight_decay) o->weight_decay(0.0);
    out.emplace_back(g.params, std::move(o));
  }
  return std::make_unique<Optim>(out, options, impl);
}

std::unique_ptr<torch::optim::Optimizer> make(const Config& c,
                                              std::vector<torch::Tensor> parameters,
                                              const std::vector<ParamGroup>* groups) {
  const std::string name = c.get_string("optimizer.name");
  const double lr = c.get_double("optimizer.lr");
  const double wd = c.get_double("optimizer.weight_decay");
  const OptimizerImpl impl = parse_optimizer_impl(c.get_string("optimizer.implementation"));
  if (name == "sgd") {
    const double momentum = c.get_double("optimizer.momentum");
    const bool nesterov = c.get_bool("optimizer.nesterov");
    if (nesterov && momentum == 0) {
      throw c.error_at("optimizer.nesterov", "nesterov needs optimizer.momentum > 0");
    }
    return build<SGD>(
        torch::optim::SGDOptions(lr).momentum(momentum).nesterov(nesterov).weight_decay(wd), impl,
        std::move(parameters), groups);
  }
  const std::vector<double> betas = c.get_double_list("optimizer.betas");
  if (betas.size() != 2)
    throw c.error_at("optimizer.betas", "expected two values like [0.9, 0.999]");
  const auto b = std::make_tuple(betas[0], betas[1]);
  const double eps = c.get_double("optimizer.eps");
  if (name == "adam") {
    return build<Adam>(torch::optim::AdamOptions(lr).betas(b).eps(eps).weight_decay(wd), impl,
                       std::move(parameters), groups);
  }
  return build<AdamW>(torch::optim::AdamWOptions(lr).betas(b).eps(eps).weight_decay(wd), impl,
                      std::move(parameters), groups);
}

const char* const kRuleKeys[] = {"optimizer.no_weight_decay", "optimizer.lr_scale"};

}  // namespace

ParamGroupRules param_group_rules(const Config& c) {
  ParamGroupRules rules;
  rules.no_weight_decay = c.get_string_list("optimizer.no_weight_decay");
  for (const auto& text : c.get_string_list("optimizer.lr_scale")) {
    try {
      rules.lr_scale.push_back(parse_lr_scale(text));
    } catch (const Error& e) {
      throw c.error_at("optimizer.lr_scale", e.what());
    }
  }
  return rules;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        std::vector<torch::Tensor> parameters) {
  for (const char* key : kRuleKeys) {
    if (!c.get_string_list(key).empty())
      throw c.error_at(key,
                       "needs the parameters' names: build the optimizer with "
                       "fabric::make_optimizer(config, *model) instead of model->parameters()");
  }
  return make(c, std::move(parameters), nullptr);
}

void check_param_group_rules(const Config& c, const torch::nn::Module& module) {
  const ParamGroupRules rules = param_group_rules(c);
  // Each key alone, so that a selector matching nothing is reported at its own key.
  ParamGroupRules decay_only, scale_only;
  decay_only.no_weight_decay = rules.no_weight_decay;
  scale_only.lr_scale = rules.lr_scale;
  for (const auto& [key, alone] :
       {std::make_pair(kRuleKeys[0], &decay_only), std::make_pair(kRuleKeys[1], &scale_only)}) {
    if (alone->empty()) continue;
    try {
      group_parameters(module, *alone);
    } catch (const Error& e) {
      throw c.error_at(key, e.what());
    }
  }
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        const torch::nn::Module& module) {
  const ParamGroupRules rules = param_group_rules(c);
  if (rules.empty()) return make(c, module.parameters(), nullptr);
  check_param_group_rules(c, module);
  const std::vector<ParamGroup> groups = group_parameters(module, rules);
  return make(c, {}, &groups);
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer_for_part(const Config& c,
                                                                 const torch::nn::Module& part) {
  const ParamGroupRules rules = param_group_rules(c);
  if (rules.empty()) return make(c, part.parameters(), nullptr);
  const std::vector<ParamGroup> groups = group_parameters(part, rules, /*require_matches=*/false);
  return make(c, {}, &groups);
}

}  // namespace fabric
