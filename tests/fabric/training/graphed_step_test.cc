// fabric::GraphedStep on CPU, where it never captures: every call is exactly the loop it replaces
// (zero_grad, forward, Fabric::backward, Fabric::step), bitwise, with fabric.cuda_graphs false or
// true (true on CPU runs eagerly after one warning at setup; tests/fabric/connector_test.cc). The
// capture itself is tested on a GPU by tests/integration/cuda_graphs_test.cc.
#include "fabric/training/graphed_step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/fabric.h"
#include "fabric/training/fast_optimizers.h"

namespace {

struct Trained {
  std::vector<torch::Tensor> params;
  std::vector<double> losses;
};

Trained train(const std::string& cuda_graphs, bool graphed, int64_t* eager_steps = nullptr) {
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(), {"fabric.accelerator=cpu", "fabric.precision=bf16-mixed",
                                  "fabric.cuda_graphs=" + cuda_graphs}));
  Trained out;
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(3);
    torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                torch::nn::Linear(16, 3));
    fabric::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
    f.setup(model, optimizer);
    auto loss_of = [&](const std::vector<torch::Tensor>& batch) {
      auto autocast = f.autocast();
      return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
    };
    fabric::GraphedStep step(f, optimizer, loss_of);
    for (int k = 0; k < 12; ++k) {
      for (auto& g : optimizer.param_groups()) g.options().set_lr(1e-2 / (1 + k));  // a schedule
      torch::manual_seed(100 + k);
      const std::vector<torch::Tensor> batch = {torch::randn({32, 8}), torch::randint(0, 3, {32})};
      torch::Tensor loss;
      if (graphed) {
        loss = step(batch);
      } else {
        optimizer.zero_grad();
        loss = loss_of(batch);
        f.backward(loss);
        f.step(optimizer);
      }
      out.losses.push_back(loss.item<double>());
    }
    EXPECT_FALSE(step.graphed());
    EXPECT_EQ(step.replays(), 0);
    if (eager_steps != nullptr) *eager_steps = step.eager_steps();
    for (const auto& p : model->parameters()) out.params.push_back(p.detach().clone());
  });
  return out;
}

TEST(GraphedStepTest, OnCpuEveryCallIsTheLoopItReplacesBitwise) {
  const Trained loop = train("false", false);
  for (const std::string graphs : {"false", "true"}) {
    SCOPED_TRACE("fabric.cuda_graphs=" + graphs);
    int64_t eager = -1;
    const Trained stepped = train(graphs, true, &eager);
    EXPECT_EQ(eager, 12);
    EXPECT_EQ(stepped.losses, loop.losses);
    ASSERT_EQ(stepped.params.size(), loop.params.size());
    for (size_t i = 0; i < loop.params.size(); ++i)
      EXPECT_TRUE(torch::equal(stepped.params[i], loop.params[i])) << "parameter " << i;
  }
  // The comparison can fail: training moved the parameters and the losses differ by step.
  EXPECT_NE(loop.losses.front(), loop.losses.back());
}

TEST(GraphedStepTest, ALossFunctionIsRequired) {
  fabric::Fabric fabric(
      fabric::Config::defaults(fabric::training_schema(), {"fabric.accelerator=cpu"}));
  torch::nn::Linear model(2, 2);
  fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(fabric::GraphedStep(fabric, optimizer, nullptr), fabric::Error);
}

}  // namespace
