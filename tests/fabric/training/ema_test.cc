// fabric::ExponentialMovingAverage: the update is the lerp toward the parameters with 1 - decay,
// the warm-up decay is min(decay, (1 + n) / (10 + n)), swapping puts the averages in and gives the
// live weights back bitwise, integer parameters are left alone, and a bad decay is an error.
// Exact resume through checkpoints: training_features_test (Cifar10AccumulationAndEmaResumeBitwise).
#include "fabric/training/ema.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fabric/core/error.h"

namespace {

using fabric::ExponentialMovingAverage;

TEST(EmaTest, UpdatesTowardTheParametersByOneMinusDecay) {
  torch::manual_seed(0);
  torch::nn::Linear layer(3, 2);
  ExponentialMovingAverage ema(*layer, 0.9, /*warmup=*/false);
  std::vector<torch::Tensor> expected;
  for (const auto& p : layer->parameters()) expected.push_back(p.detach().clone());
  for (int step = 0; step < 3; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : layer->parameters()) p.add_(torch::randn_like(p));
    }
    EXPECT_DOUBLE_EQ(ema.next_decay(), 0.9);
    ema.update();
    const auto params = layer->parameters();
    for (size_t i = 0; i < params.size(); ++i) expected[i] = expected[i] * 0.9 + params[i].detach() * 0.1;
  }
  EXPECT_EQ(ema.updates(), 3);
  auto averaged = ema.swap_into_model();
  const auto params = layer->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::allclose(params[i], expected[i], 1e-6, 1e-7)) << i;
}

TEST(EmaTest, WarmupDecayGrowsToTheConfiguredOne) {
  torch::nn::Linear layer(2, 2);
  ExponentialMovingAverage ema(*layer, 0.99);
  EXPECT_DOUBLE_EQ(ema.next_decay(), 2.0 / 11.0);
  ema.update();
  EXPECT_DOUBLE_EQ(ema.next_decay(), 3.0 / 12.0);
  for (int i = 0; i < 2000; ++i) ema.update();
  EXPECT_DOUBLE_EQ(ema.next_decay(), 0.99);
}

TEST(EmaTest, SwapGivesTheLiveWeightsBackBitwise) {
  torch::manual_seed(1);
  torch::nn::Linear layer(4, 3);
  ExponentialMovingAverage ema(*layer, 0.5, /*warmup=*/false);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : layer->parameters()) p.mul_(3).add_(1);
  }
  ema.update();
  std::vector<torch::Tensor> live;
  for (const auto& p : layer->parameters()) live.push_back(p.detach().clone());
  {
    auto averaged = ema.swap_into_model();
    EXPECT_FALSE(torch::equal(layer->weight, live[0]));
    EXPECT_THROW(ema.update(), fabric::Error);           // not while swapped
    EXPECT_THROW(ema.swap_into_model(), fabric::Error);  // not nestable
  }
  const auto params = layer->parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], live[i])) << i;
}

TEST(EmaTest, CheckpointStateNamesEveryAverageAndTheCount) {
  torch::nn::Linear layer(2, 2);
  ExponentialMovingAverage ema(*layer, 0.9);
  fabric::CheckpointState state;
  ema.add_to(state, "ema");
  EXPECT_THROW(ema.add_to(state, "ema"), fabric::Error);  // duplicate names
}

TEST(EmaTest, DecayOutsideZeroToOneIsAnError) {
  torch::nn::Linear layer(2, 2);
  EXPECT_THROW(ExponentialMovingAverage(*layer, 1.0), fabric::Error);
  EXPECT_THROW(ExponentialMovingAverage(*layer, -0.1), fabric::Error);
}

}  // namespace
