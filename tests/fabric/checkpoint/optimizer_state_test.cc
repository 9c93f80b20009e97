// Optimizer state through a checkpoint (fabric/checkpoint/optimizer_state.h) in one process:
// exact continuation for every supported optimizer and fabric's fused ones (channels-last
// parameters included), the state cast to the parameters' dtype, and mismatches named.
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <filesystem>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/training/fast_optimizers.h"
#include "tests/fabric/checkpoint/checkpoint_testing.h"

namespace fs = std::filesystem;

namespace {

using namespace fabric::checkpoint_testing;

// 3 steps, state through a file into a fresh optimizer, 2 more steps on both: bitwise equal.
template <typename Optimizer, typename Options>
void expect_exact_continuation(const Options& options, const fs::path& file) {
  torch::manual_seed(0);
  auto model = make_model();
  Optimizer opt(model->parameters(), options);
  train(model, opt, 3, 1);
  fabric::save_archive(file, fabric::optimizer_state(opt));

  auto copy = make_model();
  fabric::load_state_dict(*copy, fabric::state_dict(*model), "model");
  Optimizer fresh(copy->parameters(), Options(0.5));  // other hyperparameters: restored from file
  fabric::prepare_optimizer_state(fresh, fabric::load_archive(file), file.string())();
  train(model, opt, 2, 2);
  train(copy, fresh, 2, 2);
  const auto a = model->parameters(), b = copy->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i])) << typeid(Optimizer).name() << " parameter " << i;
  EXPECT_EQ(fresh.param_groups()[0].options().get_lr(), opt.param_groups()[0].options().get_lr());
}

TEST_F(CheckpointTest, EveryOptimizerContinuesExactly) {
  using namespace torch::optim;  // NOLINT
  const fs::path f = dir_ / "opt.ckpt";
  expect_exact_continuation<SGD>(SGDOptions(0.1).momentum(0.9).nesterov(true), f);
  expect_exact_continuation<Adam>(AdamOptions(0.01).amsgrad(true).weight_decay(0.1), f);
  expect_exact_continuation<AdamW>(AdamWOptions(0.01).betas({0.8, 0.99}), f);
  expect_exact_continuation<RMSprop>(RMSpropOptions(0.01).momentum(0.5).centered(true), f);
  expect_exact_continuation<Adagrad>(AdagradOptions(0.1).lr_decay(0.01), f);
}

// A channels-last conv net with fabric's fused optimizers: the restored state must keep each
// parameter's memory format, or the fused kernels (one flat pass over parameter, gradient and
// state together) pair elements of different positions and the resumed run drifts.
template <typename Optimizer, typename Options>
void expect_channels_last_continuation(const Options& options, const fs::path& file) {
  auto make = [] {
    auto m = torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 4, 3)),
                                   torch::nn::Tanh(), torch::nn::Flatten(),
                                   torch::nn::Linear(4 * 4 * 4, 2));
    for (auto& p : m->parameters())
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
    return m;
  };
  auto run = [](torch::nn::Sequential& m, torch::optim::Optimizer& opt, int steps, int seed) {
    torch::manual_seed(seed);
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto x = torch::randn({4, 3, 6, 6}).contiguous(at::MemoryFormat::ChannelsLast);
      torch::mse_loss(m->forward(x), torch::randn({4, 2})).backward();
      opt.step();
    }
  };
  torch::manual_seed(0);
  auto model = make();
  Optimizer opt(model->parameters(), options, fabric::OptimizerImpl::kFused);
  run(model, opt, 3, 1);
  opt.sync_state();
  fabric::save_archive(file, fabric::optimizer_state(opt));

  auto copy = make();
  fabric::load_state_dict(*copy, fabric::state_dict(*model), "model");
  ASSERT_TRUE(copy->parameters()[0].is_contiguous(at::MemoryFormat::ChannelsLast));
  Optimizer fresh(copy->parameters(), Options(0.5), fabric::OptimizerImpl::kFused);
  fabric::prepare_optimizer_state(fresh, fabric::load_archive(file), file.string())();
  run(model, opt, 2, 2);
  run(copy, fresh, 2, 2);
  const auto a = model->parameters(), b = copy->parameters();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i])) << typeid(Optimizer).name() << " parameter " << i;
}

TEST_F(CheckpointTest, ChannelsLastFusedOptimizersContinueExactly) {
  const fs::path f = dir_ / "opt.ckpt";
  expect_channels_last_continuation<fabric::SGD>(
      torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-4), f);
  expect_channels_last_continuation<fabric::AdamW>(
      torch::optim::AdamWOptions(0.01).betas({0.8, 0.99}), f);
  expect_channels_last_continuation<fabric::Adam>(torch::optim::AdamOptions(0.01).amsgrad(true), f);
}

// Resumed at another fabric.precision (32-true -> bf16-true), the state takes the parameters'
// dtype, as torch.optim's load_state_dict casts it: the fused kernels step on bf16 parameters
// (they stopped with "expected scalar type BFloat16 but found Float").
TEST_F(CheckpointTest, OptimizerStateTakesTheParametersDtype) {
  torch::manual_seed(0);
  auto model = make_model();
  fabric::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01),
                    fabric::OptimizerImpl::kFused);
  train(model, opt, 3, 1);
  opt.sync_state();
  const auto state = fabric::optimizer_state(opt);
  auto copy = make_model();
  fabric::load_state_dict(*copy, fabric::state_dict(*model), "model");
  copy->to(torch::kBFloat16);
  fabric::AdamW fresh(copy->parameters(), torch::optim::AdamWOptions(0.5),
                      fabric::OptimizerImpl::kFused);
  fabric::prepare_optimizer_state(fresh, state, "f.ckpt: opt")();
  auto exp_avg = [](const c10::IValue& saved) {
    for (const auto& e : saved.toGenericDict().at("state").toGenericDict())
      return e.value().toGenericDict().at("exp_avg").toTensor();  // the first parameter's
    return torch::Tensor();
  };
  fresh.sync_state();
  ASSERT_EQ(exp_avg(state).scalar_type(), torch::kFloat);
  EXPECT_EQ(exp_avg(fabric::optimizer_state(fresh)).scalar_type(), torch::kBFloat16);
  EXPECT_TRUE(
      torch::equal(exp_avg(fabric::optimizer_state(fresh)), exp_avg(state).to(torch::kBFloat16)));
  const torch::Tensor p = copy->parameters()[0];
  const torch::Tensor before = p.detach().clone();
  fresh.zero_grad();
  copy->forward(torch::randn({2, 4}, torch::kBFloat16)).sum().backward();
  EXPECT_NO_THROW(fresh.step());
  EXPECT_FALSE(torch::equal(p, before));
}

TEST_F(CheckpointTest, OptimizerMismatchesAreNamedAndChangeNothing) {
  auto model = make_model();
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(0.01));
  train(model, adam, 1, 1);
  const auto state = fabric::optimizer_state(adam);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(error_of([&] { fabric::prepare_optimizer_state(sgd, state, "f.ckpt: opt"); }),
            "f.ckpt: opt: does not match the optimizer: saved from Adam, the optimizer is SGD");
  auto wider = make_model(7);
  torch::optim::Adam other(wider->parameters(), torch::optim::AdamOptions(0.01));
  EXPECT_EQ(error_of([&] { fabric::prepare_optimizer_state(other, state, "f.ckpt: opt"); }),
            "f.ckpt: opt: does not match the optimizer: exp_avg of parameter 0 has shape [6, 4], "
            "the parameter [7, 4]");
  EXPECT_TRUE(other.state().empty());
}

}  // namespace
