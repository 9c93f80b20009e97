// The pipeline runner on one process (the multi-process proofs are tests/integration:
// pipeline_test): one stage equals the model's own loss and gradients bitwise; a stage's output
// of the wrong shape, a stage the rank does not hold and an uneven cut are refused in one line.
#include "fabric/distributed/pipeline_runtime.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/models/gpt.h"
#include "fabric/models/pipeline_stages.h"

namespace {

using fabric::distributed::PipelineOptions;
using fabric::distributed::PipelineRunner;
using fabric::distributed::PipelineSchedule;
using fabric::distributed::PipelineStageCalls;

fabric::models::GPT tiny(int64_t layers) {
  auto c = fabric::models::GPTConfig::preset("tiny");
  c.n_layer = layers;
  c.n_embd = 32;
  c.n_head = 2;
  c.block_size = 16;
  torch::manual_seed(3);
  return fabric::models::GPT(c);
}

TEST(PipelineRuntimeTest, OneStageIsTheModelsOwnStep) {
  auto whole = tiny(2), reference = tiny(2);
  torch::manual_seed(4);
  const torch::Tensor b = torch::randint(0, 256, {4, 17}, torch::kLong);
  const torch::Tensor x = b.narrow(1, 0, 16), y = b.narrow(1, 1, 16);
  const torch::Tensor ref_loss = reference->loss(x, y);
  ref_loss.backward();

  PipelineOptions o;
  o.schedule = PipelineSchedule::kGPipe;
  PipelineRunner runner(nullptr, o);
  EXPECT_EQ(runner.local_stages(), std::vector<int64_t>{0});
  fabric::models::GPTStages mine(whole, runner.local_stages(), runner.stages());
  PipelineStageCalls calls;
  calls.forward = [&](int64_t k, int64_t, const torch::Tensor&) { return mine->forward(k, x); };
  calls.loss = [&](int64_t, const torch::Tensor& out) { return mine->loss(out, y); };
  EXPECT_TRUE(torch::equal(runner.step(calls), ref_loss.detach()));
  const auto ref = reference->named_parameters();
  for (const auto& p : mine->named_parameters())
    EXPECT_TRUE(torch::equal(p.value().grad(), ref[p.key()].grad())) << p.key();
}

// Two virtual stages on one rank, forwards only: the whole batch's loss, no gradients.
TEST(PipelineRuntimeTest, EvaluateIsTheModelsLossWithoutGradients) {
  auto whole = tiny(2), reference = tiny(2);
  torch::manual_seed(4);
  const torch::Tensor b = torch::randint(0, 256, {4, 17}, torch::kLong);
  PipelineOptions o;
  o.schedule = PipelineSchedule::kInterleavedOneFOneB;
  o.micro_batches = 2;
  o.virtual_stages = 2;
  o.activation_sizes = {2, 16, 32};
  PipelineRunner runner(nullptr, o);
  fabric::models::GPTStages mine(whole, runner.local_stages(), runner.stages());
  const auto rows = b.chunk(2, 0);
  PipelineStageCalls calls;
  calls.forward = [&](int64_t k, int64_t mb, const torch::Tensor& in) {
    return mine->forward(k, k == 0 ? rows[static_cast<size_t>(mb)].narrow(1, 0, 16) : in);
  };
  calls.loss = [&](int64_t mb, const torch::Tensor& out) {
    return mine->loss(out, rows[static_cast<size_t>(mb)].narrow(1, 1, 16));
  };
  const double loss = runner.evaluate(calls).item<double>();
  const double expected = reference->loss(b.narrow(1, 0, 16), b.narrow(1, 1, 16)).item<double>();
  EXPECT_NEAR(loss, expected, 1e-6 * expected);
  for (const auto& p : mine->parameters()) EXPECT_FALSE(p.grad().defined());
}

TEST(PipelineRuntimeTest, AStageOutputOfTheWrongShapeNamesTheStage) {
  PipelineOptions o;
  o.schedule = PipelineSchedule::kInterleavedOneFOneB;
  o.micro_batches = 1;
  o.virtual_stages = 2;
  o.activation_sizes = {2, 16, 32};
  PipelineRunner runner(nullptr, o);
  PipelineStageCalls calls;
  calls.forward = [](int64_t, int64_t, const torch::Tensor&) { return torch::zeros({2, 8, 32}); };
  calls.loss = [](int64_t, const torch::Tensor& out) { return out.sum(); };
  try {
    runner.step(calls);
    FAIL() << "a [2, 8, 32] activation was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "pipeline: stage 0's forward of micro-batch 0 returned [2, 8, 32] Float; the next "
              "stage expects [2, 16, 32] Float (PipelineOptions::activation_sizes and "
              "activation_dtype)");
  }
  o.activation_sizes.clear();
  EXPECT_THROW(PipelineRunner(nullptr, o), fabric::Error);
}

TEST(PipelineRuntimeTest, GptStagesRefuseAnUnevenCutAndForeignStages) {
  auto whole = tiny(3);
  try {
    fabric::models::GPTStages(whole, std::vector<int64_t>{0}, 2);
    FAIL() << "3 blocks in 2 stages was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 blocks (model.n_layer) do not split evenly into 2 "
                                         "pipeline stages; stage counts that divide 3: 1, 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(fabric::models::GPTStages(whole, std::vector<int64_t>{3}, 3), fabric::Error);
  fabric::models::GPTStages middle(whole, std::vector<int64_t>{1}, 3);
  EXPECT_FALSE(middle->wte);  // neither the first nor the last stage: no embedding
  EXPECT_EQ(middle->blocks_of(1), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_THROW(middle->loss(torch::zeros({1, 4, 128}), torch::zeros({1, 4}, torch::kLong)),
               fabric::Error);
}

}  // namespace

namespace {

TEST(PipelineRuntimeTest, SequentialSplitPointsAreChecked) {
  torch::nn::Sequential net(torch::nn::Linear(4, 4), torch::nn::Tanh(), torch::nn::Linear(4, 4));
  fabric::models::SequentialStages first(net, std::vector<int64_t>{0}, 2, std::vector<int64_t>{1});
  EXPECT_EQ(first->blocks_of(0), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(first->named_parameters().size(), 2u);  // "0.weight", "0.bias"
  EXPECT_TRUE(first->named_parameters().contains("0.weight"));
  fabric::models::SequentialStages last(net, std::vector<int64_t>{1}, 2, std::vector<int64_t>{1});
  EXPECT_TRUE(last->named_parameters().contains("2.weight"));
  try {
    fabric::models::SequentialStages(net, std::vector<int64_t>{0}, 2, std::vector<int64_t>{3});
    FAIL() << "a split point past the end was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "pipeline split points {3}: 3 does not start a stage of at least one module "
              "(points strictly increase inside 1 .. 2 for a Sequential of 3 modules)");
  }
  EXPECT_THROW(
      fabric::models::SequentialStages(net, std::vector<int64_t>{0}, 3, std::vector<int64_t>{1}),
      fabric::Error);  // 1 point for 3 stages
  EXPECT_THROW(fabric::models::SequentialStages(net, std::vector<int64_t>{0}, 2),
               fabric::Error);  // 3 modules do not split evenly into 2
}

TEST(PipelineRuntimeTest, MicroBatchesMustDivideTheBatch) {
  const auto parts = fabric::distributed::split_micro_batches(torch::arange(8).view({4, 2}), 2);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_TRUE(torch::equal(parts[1], torch::tensor({4, 5, 6, 7}).view({2, 2})));
  try {
    fabric::distributed::split_micro_batches(torch::zeros({6, 3}), 4);
    FAIL() << "6 rows into 4 micro-batches was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "a batch of 6 rows does not split into 4 equal micro-batches "
              "(fabric.pipeline.micro_batches); use a batch size that is a multiple of 4 (4, 8, "
              "...), or micro_batches that divides 6 (1, 2, 3, 6)");
  }
}

}  // namespace
