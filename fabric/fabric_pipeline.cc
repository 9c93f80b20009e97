// Fabric's pipeline-parallel step (fabric/fabric.h): the runner's options from the config, and
// one step's forwards and backwards with the gradients synchronized once.
#include "fabric/connector.h"
#include "fabric/distributed/pipeline_runtime.h"
#include "fabric/fabric.h"

namespace fabric {

int64_t Fabric::pipeline_parallel_size() const {
  return setup_->strategy == StrategyKind::kModelParallel
             ? setup_->model_parallel.pipeline_parallel_size
             : 1;
}

distributed::PipelineOptions Fabric::pipeline_options() const {
  distributed::PipelineOptions o;
  const auto& mp = setup_->model_parallel;
  o.schedule = distributed::parse_pipeline_schedule(mp.pipeline_schedule);
  o.micro_batches = mp.micro_batches;
  o.virtual_stages = mp.virtual_stages;
  o.device = device();
  return o;
}

void Fabric::setup_pipeline_tied(const torch::Tensor& weight,
                                 const distributed::PipelineRunner& runner) {
  if (!weight.defined()) return;
  strategy_->set_shared_parameter(weight, runner.holds_first());
}

torch::Tensor Fabric::pipeline_backward(distributed::PipelineRunner& runner,
                                        const distributed::PipelineStageCalls& calls,
                                        const torch::Tensor& tied) {
  distributed::PipelineStageCalls with = calls;
  with.forward = [this, &calls](int64_t stage, int64_t mb, const torch::Tensor& in) {
    auto guard = autocast();
    return calls.forward(stage, mb, in);
  };
  with.loss = [this, &calls](int64_t mb, const torch::Tensor& out) {
    auto guard = autocast();
    return calls.loss(mb, out);
  };
  if (!with.backward)
    with.backward = [this](const torch::Tensor& loss) { precision().backward(loss); };
  phase_ = Phase::kBackward;
  torch::Tensor loss;
  {
    const ScopeGuard no_sync = strategy_->no_backward_sync();
    loss = runner.step(with);
  }
  if (tied.defined() && tied.grad().defined() && runner.size() > 1)
    runner.sum_between(tied.mutable_grad(), 0, runner.size() - 1);
  strategy_->sync_accumulated_gradients();
  phase_ = Phase::kAfterBackward;
  return loss;
}

}  // namespace fabric
