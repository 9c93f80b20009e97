// fabric::GraphedStep on CPU, where it never captures: every call is exactly the loop it replaces
// (zero_grad, forward, Fabric::backward, Fabric::step), bitwise, with fabric.cuda_graphs false or
// true (true on CPU runs eagerly after one warning at setup; tests/fabric/connector_test.cc). The
// capture itself is tested on a GPU by tests/integration/cuda_graphs_test.cc. Clipping inside the
// step is Fabric's clipping, and clip_grad_norm_on_device is LibTorch's clip_grad_norm_, bitwise.
#include "fabric/graphed_step.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <limits>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/fabric.h"
#include "fabric/training/clip.h"
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

// Clipping inside the step (GraphedStepOptions) is Fabric::clip_gradients / clip_gradients_value
// between backward and step, bitwise, in bf16-mixed; and it did clip (results differ without it).
// `norms`: the total norm before clipping of every step (clip_norm only).
std::vector<torch::Tensor> train_clipped(const fabric::GraphedStepOptions& options, bool graphed,
                                         std::vector<double>* norms) {
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(), {"fabric.accelerator=cpu", "fabric.precision=bf16-mixed"}));
  std::vector<torch::Tensor> out;
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(4);
    torch::nn::Sequential model(torch::nn::Linear(8, 16), torch::nn::ReLU(),
                                torch::nn::Linear(16, 3));
    fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.5).momentum(0.9));
    f.setup(model, optimizer);
    auto loss_of = [&](const std::vector<torch::Tensor>& batch) {
      auto autocast = f.autocast();
      return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
    };
    fabric::GraphedStep step(f, optimizer, loss_of, options);
    for (int k = 0; k < 8; ++k) {
      torch::manual_seed(200 + k);
      const std::vector<torch::Tensor> batch = {torch::randn({16, 8}), torch::randint(0, 3, {16})};
      if (graphed) {
        step(batch);
        if (options.clip_norm() > 0) norms->push_back(step.grad_norm().item<double>());
        continue;
      }
      optimizer.zero_grad();
      f.backward(loss_of(batch));
      if (options.clip_norm() > 0)
        norms->push_back(
            f.clip_gradients(model, optimizer, options.clip_norm(), options.norm_type()));
      if (options.clip_value() > 0) f.clip_gradients_value(model, optimizer, options.clip_value());
      f.step(optimizer);
    }
    for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  });
  return out;
}

TEST(GraphedStepTest, ClippingInsideTheStepIsFabricsClippingBitwise) {
  std::vector<double> ignored;
  const auto unclipped = train_clipped({}, true, &ignored);
  fabric::GraphedStepOptions by_norm, by_inf_norm, by_value;
  by_norm.clip_norm(0.05);
  by_inf_norm.clip_norm(0.02);
  by_inf_norm.norm_type(std::numeric_limits<double>::infinity());
  by_value.clip_value(0.005);
  for (const auto& options : {by_norm, by_inf_norm, by_value}) {
    SCOPED_TRACE("clip_norm " + std::to_string(options.clip_norm()) + " norm_type " +
                 std::to_string(options.norm_type()) + " clip_value " +
                 std::to_string(options.clip_value()));
    std::vector<double> loop_norms, step_norms;
    const auto loop = train_clipped(options, false, &loop_norms);
    const auto stepped = train_clipped(options, true, &step_norms);
    EXPECT_EQ(step_norms, loop_norms);  // GraphedStep::grad_norm() is Fabric::clip_gradients'
    EXPECT_EQ(step_norms.size(), options.clip_norm() > 0 ? 8u : 0u);
    bool clipped = false;
    for (size_t i = 0; i < loop.size(); ++i) {
      EXPECT_TRUE(torch::equal(stepped[i], loop[i])) << "parameter " << i;
      clipped |= !torch::equal(stepped[i], unclipped[i]);
    }
    EXPECT_TRUE(clipped) << "the clip never bit: the comparison proves nothing";
  }
}

TEST(GraphedStepTest, ClippingOptionsAreChecked) {
  fabric::Fabric fabric(
      fabric::Config::defaults(fabric::training_schema(), {"fabric.accelerator=cpu"}));
  torch::nn::Linear model(2, 2);
  fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  auto loss = [](const std::vector<torch::Tensor>& b) { return b[0].sum(); };
  fabric::GraphedStepOptions both, negative;
  both.clip_norm(1);
  both.clip_value(1);
  negative.clip_norm(-1);
  for (const auto& options : {both, negative}) {
    try {
      fabric::GraphedStep step(fabric, optimizer, loss, options);
      ADD_FAILURE() << "accepted clip_norm " << options.clip_norm() << " clip_value "
                    << options.clip_value();
    } catch (const fabric::Error& e) {
      EXPECT_NE(std::string(e.what()).find("at most one of them > 0"), std::string::npos)
          << e.what();
    }
  }
}

TEST(ClipTest, OnDeviceClippingIsLibTorchsClipGradNormBitwise) {
  for (const double norm_type : {2.0, 1.0, 3.5, std::numeric_limits<double>::infinity(), 0.0}) {
    for (const double max_norm : {0.3, 1e6}) {  // clips / leaves alone
      SCOPED_TRACE("norm_type " + std::to_string(norm_type) + " max_norm " +
                   std::to_string(max_norm));
      auto make = [] {
        torch::manual_seed(9);
        std::vector<torch::Tensor> params;
        for (const int64_t n : {7, 64, 1}) {
          params.push_back(torch::randn({n}).requires_grad_());
          params.back().mutable_grad() = torch::randn({n}) * 3;
        }
        params.push_back(torch::randn({3}).requires_grad_());  // no gradient: skipped
        return params;
      };
      auto ours = make(), theirs = make();
      const torch::Tensor norm = fabric::clip_grad_norm_on_device(ours, max_norm, norm_type);
      const double expected = torch::nn::utils::clip_grad_norm_(theirs, max_norm, norm_type);
      EXPECT_EQ(norm.item<double>(), expected);
      for (size_t i = 0; i + 1 < ours.size(); ++i)
        EXPECT_TRUE(torch::equal(ours[i].grad(), theirs[i].grad())) << "gradient " << i;
      EXPECT_FALSE(ours.back().grad().defined());
    }
  }
  EXPECT_EQ(fabric::clip_grad_norm_on_device({torch::zeros({2})}, 1.0).item<double>(), 0.0);
}

TEST(GraphedStepTest, ALossFunctionIsRequired) {
  fabric::Fabric fabric(
      fabric::Config::defaults(fabric::training_schema(), {"fabric.accelerator=cpu"}));
  torch::nn::Linear model(2, 2);
  fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THROW(fabric::GraphedStep(fabric, optimizer, nullptr), fabric::Error);
}

}  // namespace
