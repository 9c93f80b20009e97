// fabric::FlopCounter counts the dense operators of a step (Linear, convolution, attention, in
// forward and backward) by the formulas its header gives, and the GPT's count per token matches
// GPTConfig::flops_per_token; fabric::Throughput turns units and seconds into rates, TFLOP/s and
// MFU per rank and for the job.
#include <gtest/gtest.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <string>

#include "fabric/core/error.h"
#include "fabric/models/gpt.h"
#include "fabric/training/flop_counter.h"
#include "fabric/training/throughput.h"

namespace {

TEST(FlopCounterTest, ALinearStepCountsItsForwardThreeTimes) {
  torch::manual_seed(0);
  torch::nn::Linear linear(64, 32);
  const torch::Tensor x = torch::randn({8, 64}, torch::requires_grad());
  fabric::FlopCounter counter;
  const torch::Tensor y = linear->forward(x);
  const double forward = counter.total();
  y.sum().backward();
  EXPECT_EQ(forward, 2.0 * 8 * 64 * 32);
  EXPECT_EQ(counter.total(), 3 * forward);  // dX and dW
}

TEST(FlopCounterTest, AConvolutionCountsOutputsTimesKernelAndItsGradients) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).stride(2).padding(1));
  const double forward = 2.0 * (2 * 8 * 8 * 8) * (3 * 3 * 3);  // [2, 8, 8, 8] outputs
  {
    fabric::FlopCounter counter;
    conv->forward(torch::randn({2, 3, 16, 16})).sum().backward();
    EXPECT_EQ(counter.total(), 2 * forward);  // the weight's gradient only
  }
  fabric::FlopCounter counter;
  conv->forward(torch::randn({2, 3, 16, 16}, torch::requires_grad())).sum().backward();
  EXPECT_EQ(counter.total(), 3 * forward);
  EXPECT_EQ(counter.by_operator().at("aten::convolution"), forward);
}

TEST(FlopCounterTest, TheGptCountsItsFormulaPerTokenLessTheElementwiseParameters) {
  torch::manual_seed(0);
  fabric::models::GPTConfig c = fabric::models::GPTConfig::preset("tiny");
  c.block_size = 64;
  fabric::models::GPT model(c);
  const torch::Tensor tokens = torch::randint(0, c.vocab_size, {2, 65}, torch::kLong);
  fabric::FlopCounter counter;
  model->loss(tokens.narrow(1, 0, 64), tokens.narrow(1, 1, 64)).backward();
  const double per_token = counter.total() / (2 * 64);
  // The formula's 6N counts biases and LayerNorm parameters too; the counter counts GEMMs only.
  const double elementwise = 6.0 * c.n_layer * (4 * c.n_embd + 9 * c.n_embd) + 6.0 * 2 * c.n_embd;
  EXPECT_NEAR(per_token, c.flops_per_token() - elementwise, 1e-9 * per_token);
  EXPECT_GT(counter.by_operator().count("aten::scaled_dot_product_attention"), 0u);
}

TEST(FlopCounterTest, OneCounterAtATime) {
  fabric::FlopCounter counter;
  try {
    fabric::FlopCounter second;
    FAIL() << "a second counter was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("one at a time"), std::string::npos) << e.what();
  }
}

TEST(ThroughputTest, RatesPerRankAndForTheJob) {
  fabric::Throughput tp(4, 100.0);  // 4 devices of 100 TFLOP/s
  tp.set_flops_per_unit(1e12, "config");
  const auto r = tp.rates(100, 2.0);
  EXPECT_DOUBLE_EQ(r.per_rank, 50);
  EXPECT_DOUBLE_EQ(r.job, 200);
  EXPECT_DOUBLE_EQ(r.tflops_per_rank, 50);
  EXPECT_DOUBLE_EQ(r.tflops, 200);
  EXPECT_DOUBLE_EQ(r.mfu, 0.5);
  const auto m = fabric::Throughput::metrics(r, "samples");
  EXPECT_DOUBLE_EQ(m.at("train/samples_per_second"), 200);
  EXPECT_DOUBLE_EQ(m.at("train/mfu"), 0.5);

  fabric::Throughput unknown(2, std::nullopt);
  const auto u = unknown.rates(10, 1.0);
  EXPECT_EQ(u.mfu, -1);
  EXPECT_EQ(u.tflops, -1);
  EXPECT_EQ(fabric::Throughput::metrics(u, "tokens").count("train/mfu"), 0u);
  EXPECT_THROW(unknown.set_flops_per_unit(-1, "config"), fabric::Error);
}

}  // namespace
