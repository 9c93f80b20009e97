// fabric::ExponentialMovingAverage: the update is the lerp toward the parameters with 1 - decay,
// the warm-up decay is min(decay, (1 + n) / (10 + n)), swapping puts the averages in and gives the
// live weights back bitwise, integer parameters are left alone, and a bad decay is an error.
// Parts of parameters (fsdp's, fabric/training/parameter_parts.h) average as the whole does and
// are checkpointed as pieces, gathered whole, and loaded from either.
// Exact resume through checkpoints: training_features_test
// (Cifar10AccumulationAndEmaResumeBitwise).
#include "fabric/training/ema.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "fabric/checkpoint/sharded.h"
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
    for (size_t i = 0; i < params.size(); ++i)
      expected[i] = expected[i] * 0.9 + params[i].detach() * 0.1;
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

// Two "ranks" holding fsdp-like parts of a Linear(5, 3): its 18 elements laid end to end (weight,
// then bias), rank 0 keeping elements [0, 9) (weight only, none of the bias), rank 1 [9, 18).
fabric::ParameterParts rank_parts(torch::nn::Linear& layer, int rank, int* changed) {
  fabric::ParameterParts out;
  const torch::Tensor w = layer->weight.detach().view(-1), b = layer->bias.detach();
  if (rank == 0) {
    out.parts.push_back({"weight", w.narrow(0, 0, 9), {3, 5}, 0, true});
    out.parts.push_back({"bias", b.narrow(0, 0, 0), {3}, 0, true});
  } else {
    out.parts.push_back({"weight", w.narrow(0, 9, 6), {3, 5}, 9, true});
    out.parts.push_back({"bias", b, {3}, 0, true});
  }
  out.changed = [changed] { ++*changed; };
  return out;
}

TEST(EmaTest, PartsOfTheParametersAverageAsTheWholeDoes) {
  torch::manual_seed(2);
  torch::nn::Linear layer(5, 3);
  int changed = 0;
  ExponentialMovingAverage whole(*layer, 0.8);
  ExponentialMovingAverage first(rank_parts(layer, 0, &changed), 0.8);
  ExponentialMovingAverage second(rank_parts(layer, 1, &changed), 0.8);
  for (int step = 0; step < 4; ++step) {
    {
      torch::NoGradGuard no_grad;
      for (auto& p : layer->parameters()) p.add_(torch::randn_like(p));
    }
    whole.update();
    first.update();
    second.update();
  }
  std::vector<torch::Tensor> expected;
  {
    auto averaged = whole.swap_into_model();
    for (const auto& p : layer->parameters()) expected.push_back(p.detach().clone());
  }
  const torch::Tensor live = layer->weight.detach().clone();
  {
    auto a = first.swap_into_model();
    auto b = second.swap_into_model();
    EXPECT_TRUE(torch::equal(layer->weight, expected[0]));
    EXPECT_TRUE(torch::equal(layer->bias, expected[1]));
    EXPECT_EQ(changed, 2);  // each swap says the parts changed
  }
  EXPECT_EQ(changed, 4);
  EXPECT_TRUE(torch::equal(layer->weight, live));
}

TEST(EmaTest, SplitPartsAreCheckpointedAsPiecesGatheredWholeAndLoadedFromEither) {
  torch::manual_seed(3);
  torch::nn::Linear layer(5, 3);
  int changed = 0;
  fabric::ParameterParts parts = rank_parts(layer, 1, &changed);
  const torch::Tensor full = torch::arange(15, torch::kFloat).view({3, 5});
  parts.gather = [full](const torch::Tensor&, size_t i) {
    return i == 0 ? full : torch::zeros({3});
  };
  ExponentialMovingAverage ema(parts, 0.9);
  fabric::CheckpointState state;
  ema.add_to(state, "ema");
  const auto& weight = state.entries()[0];
  ASSERT_EQ(weight.name, "ema.weight");
  const auto piece = fabric::as_tensor_piece(weight.save());
  ASSERT_TRUE(piece.has_value());
  EXPECT_EQ(piece->offset, 9);
  EXPECT_EQ(piece->sizes, (std::vector<int64_t>{3, 5}));
  EXPECT_TRUE(torch::equal(piece->values, layer->weight.detach().view(-1).narrow(0, 9, 6)));
  ASSERT_TRUE(weight.gather);
  EXPECT_TRUE(torch::equal(weight.gather().toTensor(), full));
  // Loading from the whole tensor takes this rank's elements; a piece of another range or a
  // tensor of another shape is refused naming both.
  weight.prepare(full, "ckpt")();
  {
    auto averaged = ema.swap_into_model();
    EXPECT_TRUE(torch::equal(layer->weight.detach().view(-1).narrow(0, 9, 6),
                             torch::arange(9, 15, torch::kFloat)));
  }
  try {
    weight.prepare(torch::zeros({5, 3}), "ckpt");
    ADD_FAILURE() << "a reshaped tensor was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(), "ckpt: a tensor of shape [5, 3], expected [3, 5]");
  }
  const auto other = fabric::tensor_piece({3, 5}, {5, 1}, 0, torch::zeros({9}));
  try {
    weight.prepare(other, "ckpt");
    ADD_FAILURE() << "another rank's piece was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "ckpt: holds elements 0 to 9 of a tensor of shape [3, 5]; this rank keeps "
                 "elements 9 to 15 of shape [3, 5]");
  }
}

TEST(EmaTest, AModuleWhoseParametersHoldNoMemoryIsRefused) {
  torch::nn::Linear layer(2, 2);
  // As fsdp leaves a sharded parameter: its shape kept, its storage's memory freed.
  c10::StorageImpl* storage = layer->weight.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, torch::kCPU));
  storage->set_nbytes(0);
  try {
    ExponentialMovingAverage ema(*layer, 0.9);
    ADD_FAILURE() << "accepted";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("parameter weight holds no memory of its own"),
              std::string::npos)
        << e.what();
  }
}

TEST(EmaTest, DecayOutsideZeroToOneIsAnError) {
  torch::nn::Linear layer(2, 2);
  EXPECT_THROW(ExponentialMovingAverage(*layer, 1.0), fabric::Error);
  EXPECT_THROW(ExponentialMovingAverage(*layer, -0.1), fabric::Error);
}

}  // namespace
