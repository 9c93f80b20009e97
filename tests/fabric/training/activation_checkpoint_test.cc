// fabric::checkpoint_activations / fabric::checkpoint: a deep MLP with Dropout and BatchNorm whose
// blocks are checkpointed gives the loss, every parameter gradient and every BatchNorm running
// statistic bitwise equal to the plain model's, in fp32 and under CPU bf16 autocast; parameters get
// gradients when the input needs none; the generic function form passes gradients to each of
// several inputs; without gradients the function just runs (nothing recorded).
#include "fabric/training/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

namespace {

torch::nn::Sequential block(int64_t width) {
  return torch::nn::Sequential(torch::nn::Linear(width, width), torch::nn::BatchNorm1d(width),
                               torch::nn::GELU(), torch::nn::Dropout(0.2));
}

struct Net {
  std::vector<torch::nn::Sequential> blocks;
  explicit Net(int64_t depth, int64_t width) {
    torch::manual_seed(7);
    for (int64_t i = 0; i < depth; ++i) blocks.push_back(block(width));
  }
  torch::Tensor forward(torch::Tensor x, bool checkpointed) {
    for (auto& b : blocks) x = checkpointed ? fabric::checkpoint_activations(b, x) : b->forward(x);
    return x;
  }
  std::vector<torch::Tensor> grads_and_buffers() const {
    std::vector<torch::Tensor> out;
    for (const auto& b : blocks) {
      for (const auto& p : b->parameters()) out.push_back(p.grad().clone());
      for (const auto& buf : b->buffers()) out.push_back(buf.clone());
    }
    return out;
  }
};

// Two identical nets, one plain and one checkpointed, two training-mode steps on the same data
// and random state: the losses, gradients and running statistics must be bitwise equal.
void expect_bitwise(bool input_requires_grad, bool autocast) {
  Net plain(6, 32), ckpt(6, 32);
  auto x = torch::randn({16, 32}).requires_grad_(input_requires_grad);
  torch::Tensor input_grad[2];
  for (int step = 0; step < 2; ++step) {
    torch::Tensor loss[2];
    for (int which = 0; which < 2; ++which) {
      Net& net = which == 0 ? plain : ckpt;
      torch::manual_seed(100 + step);  // the same dropout masks for both
      at::autocast::set_autocast_enabled(at::kCPU, autocast);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
      loss[which] = net.forward(x, which == 1).to(torch::kFloat).pow(2).mean();
      at::autocast::set_autocast_enabled(at::kCPU, false);
      loss[which].backward();
      if (input_requires_grad) {
        input_grad[which] = x.grad().clone();
        x.mutable_grad().reset();
      }
    }
    EXPECT_TRUE(torch::equal(loss[0], loss[1])) << "step " << step;
    if (input_requires_grad) {
      EXPECT_TRUE(torch::equal(input_grad[0], input_grad[1]));
    }
  }
  const auto a = plain.grads_and_buffers(), b = ckpt.grads_and_buffers();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << i;
    EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
  }
}

TEST(ActivationCheckpointTest, GradientsAndBuffersBitwiseThePlainModels) {
  expect_bitwise(true, false);
}

TEST(ActivationCheckpointTest, ParametersGetGradientsWhenTheInputNeedsNone) {
  expect_bitwise(false, false);
}

TEST(ActivationCheckpointTest, UnderBf16AutocastTheRecomputationCastsTheSame) {
  expect_bitwise(true, true);
}

TEST(ActivationCheckpointTest, FunctionOfSeveralInputs) {
  auto a = torch::randn({5, 3}, torch::requires_grad());
  auto b = torch::randn({3, 4}, torch::requires_grad());
  auto fn = [](const fabric::TensorList& in) {
    return fabric::TensorList{torch::tanh(in[0].matmul(in[1])), in[0].sum()};
  };
  auto plain = fn({a, b});
  (plain[0].pow(2).sum() + plain[1]).backward();
  const auto ga = a.grad().clone(), gb = b.grad().clone();
  a.mutable_grad().reset();
  b.mutable_grad().reset();
  auto outs = fabric::checkpoint(fn, {a, b});
  EXPECT_TRUE(torch::equal(outs[0], plain[0]));
  (outs[0].pow(2).sum() + outs[1]).backward();
  EXPECT_TRUE(torch::equal(a.grad(), ga));
  EXPECT_TRUE(torch::equal(b.grad(), gb));
}

TEST(ActivationCheckpointTest, WithoutGradientsTheFunctionJustRuns) {
  auto a = torch::randn({4}, torch::requires_grad());
  torch::NoGradGuard no_grad;
  auto out = fabric::checkpoint(
      [](const fabric::TensorList& in) { return fabric::TensorList{in[0] * 2}; }, {a});
  EXPECT_FALSE(out[0].requires_grad());
  EXPECT_TRUE(torch::equal(out[0], a * 2));
}

}  // namespace
