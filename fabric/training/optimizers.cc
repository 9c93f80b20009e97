#include "fabric/training/optimizers.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

namespace fabric {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Config& c,
                                                        std::vector<torch::Tensor> parameters) {
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
    return std::make_unique<SGD>(
        std::move(parameters),
        torch::optim::SGDOptions(lr).momentum(momentum).nesterov(nesterov).weight_decay(wd), impl);
  }
  const std::vector<double> betas = c.get_double_list("optimizer.betas");
  if (betas.size() != 2)
    throw c.error_at("optimizer.betas", "expected two values like [0.9, 0.999]");
  const auto b = std::make_tuple(betas[0], betas[1]);
  const double eps = c.get_double("optimizer.eps");
  if (name == "adam") {
    return std::make_unique<Adam>(
        std::move(parameters), torch::optim::AdamOptions(lr).betas(b).eps(eps).weight_decay(wd),
        impl);
  }
  return std::make_unique<AdamW>(
      std::move(parameters), torch::optim::AdamWOptions(lr).betas(b).eps(eps).weight_decay(wd),
      impl);
}

}  // namespace fabric
