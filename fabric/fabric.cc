#include "fabric/fabric.h"

#include <torch/torch.h>

namespace fabric {

Fabric::Fabric(const Config& config) : Fabric(config, MachineFacts::query()) {}

Fabric::Fabric(const Config& config, const MachineFacts& facts)
    : config_(config), setup_(resolve_setup(config, facts)), strategy_(build_strategy(setup_)) {
  apply_global_settings(setup_);
  if (is_global_zero())
    for (const auto& w : setup_.warnings) std::cerr << "warning: " << w << std::endl;
}

Fabric::~Fabric() = default;

int Fabric::launch(const std::function<void(Fabric&)>& fn) {
  strategy_->setup_environment();
  seed_everything(setup_.seed);
  try {
    fn(*this);
  } catch (...) {
    strategy_->teardown_after_error();  // other ranks may never reach the teardown barrier
    throw;
  }
  strategy_->teardown();
  return 0;
}

void Fabric::setup_module(torch::nn::Module& module) { strategy_->setup_module(module); }

void Fabric::setup_optimizer(torch::optim::Optimizer& optimizer) {
  strategy_->setup_optimizer(optimizer);
}

DataLoader Fabric::setup_dataloader(std::shared_ptr<const Dataset> dataset,
                                    DataLoaderOptions options) {
  if (!options.seed()) options.seed(setup_.seed);
  LoaderPlacement placement;
  placement.num_replicas = world_size();
  placement.rank = global_rank();
  placement.device = device();
  return DataLoader(std::move(dataset), std::move(options), placement);
}

void Fabric::backward(const torch::Tensor& loss) { strategy_->backward(loss); }

bool Fabric::step(torch::optim::Optimizer& optimizer) {
  return strategy_->optimizer_step(optimizer);
}

double Fabric::clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                   double max_norm, double norm_type) {
  precision().unscale_gradients(optimizer);
  return torch::nn::utils::clip_grad_norm_(module.parameters(), max_norm, norm_type);
}

void Fabric::clip_gradients_by_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                     double clip_value) {
  precision().unscale_gradients(optimizer);
  torch::nn::utils::clip_grad_value_(module.parameters(), clip_value);
}

AutocastGuard Fabric::autocast() const { return strategy_->precision().autocast(); }

void Fabric::seed_everything(uint64_t seed) { torch::manual_seed(seed); }

torch::Tensor Fabric::to_device(const torch::Tensor& tensor) const {
  return tensor.defined() ? tensor.to(device(), /*non_blocking=*/true) : tensor;
}

Batch Fabric::to_device(const Batch& batch) const {
  return {to_device(batch.data), to_device(batch.target)};
}

torch::Tensor Fabric::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  return strategy_->all_reduce(tensor, op);
}

void Fabric::barrier() { strategy_->barrier(); }

torch::Tensor Fabric::broadcast(const torch::Tensor& tensor, int64_t src) {
  return strategy_->broadcast(tensor, src);
}

}  // namespace fabric
