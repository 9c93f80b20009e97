// fabric::models::GPT on a CUDA device (tag gpu; skips elsewhere): lm_loss on fp16 logits (the
// softmax kernel upcasting, no float32 copy) and on bf16 logits equals cross-entropy on a float32
// copy, value and gradient; the blocks' linear layers (ATen's linear, bias inside the GEMM) equal
// torch::nn::Linear's forward; a bf16-mixed step of the tiny model on the GPU lowers its loss.
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include "fabric/models/gpt.h"
#include "tests/cuda_skip.h"

namespace {

using fabric::models::GPT;
using fabric::models::GPTConfig;

class LmLossTest : public ::testing::TestWithParam<torch::ScalarType> {};

TEST_P(LmLossTest, EqualsCrossEntropyOnAFloat32Copy) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const torch::Tensor base = (3 * torch::randn({4, 64, 1000}, opts)).to(GetParam());
  const torch::Tensor targets = torch::randint(0, 1000, {4, 64}, opts.dtype(torch::kLong));
  torch::Tensor a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
  const torch::Tensor ours = fabric::models::lm_loss(a, targets);
  const torch::Tensor reference =
      torch::cross_entropy_loss(b.reshape({-1, 1000}).to(torch::kFloat), targets.reshape({-1}));
  ours.backward();
  reference.backward();
  EXPECT_EQ(ours.scalar_type(), torch::kFloat);
  EXPECT_NEAR(ours.item<double>(), reference.item<double>(), 1e-6 * reference.item<double>());
  ASSERT_EQ(a.grad().scalar_type(), GetParam());
  const double diff = (a.grad().to(torch::kFloat) - b.grad().to(torch::kFloat)).abs().max().item<double>();
  const double scale = b.grad().to(torch::kFloat).abs().max().item<double>();
  EXPECT_LE(diff, scale / 128) << "gradients differ by more than one 16-bit step: " << diff;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LmLossTest, ::testing::Values(torch::kHalf, torch::kBFloat16));

TEST(GPTCudaTest, BlockLinearsEqualTorchNnLinear) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  GPTConfig c = GPTConfig::preset("tiny");
  c.n_layer = 1;
  fabric::models::MLP mlp(c);
  mlp->to(torch::kCUDA);
  const torch::Tensor x = torch::randn({2, 16, c.n_embd}, torch::kCUDA);
  torch::NoGradGuard no_grad;
  const torch::Tensor reference = mlp->c_proj->forward(torch::gelu(mlp->c_fc->forward(x), "tanh"));
  EXPECT_TRUE(torch::allclose(mlp->forward(x), reference, 1e-5, 1e-5));
}

TEST(GPTCudaTest, ABf16MixedStepOfTheTinyModelLowersItsLoss) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  GPT model(GPTConfig::preset("tiny"));
  model->to(torch::kCUDA);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
  const torch::Tensor w = torch::arange(257, torch::kLong).remainder(17).view({1, 257}).repeat({4, 1}).to(torch::kCUDA);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    const torch::Tensor logits = model->forward(w.narrow(1, 0, 256));
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    const torch::Tensor loss = fabric::models::lm_loss(logits, w.narrow(1, 1, 256));
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
}

}  // namespace
