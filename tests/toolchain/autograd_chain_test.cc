// Proves the toolchain chain end to end on CPU: LibTorch headers, libraries, dispatcher and
// autograd all work from a Bazel-built binary. Inputs are small dyadic numbers, so every expected
// value is exact in float32 and the checks are bitwise (torch::equal), not approximate.
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

namespace {

TEST(AutogradChainTest, ElementwisePolynomialHasExactGradients) {
  // f(x, w) = sum(w * x^2 + 3 x)  ⇒  df/dx = 2 w x + 3,  df/dw = x^2.
  auto x = torch::tensor({1.0f, -2.0f, 0.5f, 4.0f}, torch::requires_grad());
  auto w = torch::tensor({3.0f, 0.25f, -1.0f, 2.0f}, torch::requires_grad());
  auto f = (w * x.pow(2) + 3 * x).sum();
  f.backward();

  EXPECT_EQ(f.item<float>(), 3.0f + 1.0f - 0.25f + 32.0f + 3.0f * (1.0f - 2.0f + 0.5f + 4.0f));
  EXPECT_TRUE(torch::equal(x.grad(), torch::tensor({9.0f, 2.0f, 2.0f, 19.0f})));
  EXPECT_TRUE(torch::equal(w.grad(), torch::tensor({1.0f, 4.0f, 0.25f, 16.0f})));
}

TEST(AutogradChainTest, LinearLayerGradientsMatchTheClosedForm) {
  // loss = sum(x Wᵀ + b)  ⇒  dL/dW = 1ᵀ x (each row is the column sums of x), dL/db = batch size.
  torch::nn::Linear linear(torch::nn::LinearOptions(3, 2));
  {
    torch::NoGradGuard no_grad;
    linear->weight.copy_(torch::tensor({{1.0f, 2.0f, 3.0f}, {-1.0f, 0.5f, 0.0f}}));
    linear->bias.copy_(torch::tensor({0.5f, -0.5f}));
  }
  auto x = torch::tensor({{1.0f, 2.0f, 3.0f}, {4.0f, 5.0f, 6.0f}});
  auto y = linear->forward(x);
  EXPECT_TRUE(torch::equal(y, torch::tensor({{14.5f, -0.5f}, {32.5f, -2.0f}})));

  y.sum().backward();
  EXPECT_TRUE(
      torch::equal(linear->weight.grad(), torch::tensor({{5.0f, 7.0f, 9.0f}, {5.0f, 7.0f, 9.0f}})));
  EXPECT_TRUE(torch::equal(linear->bias.grad(), torch::tensor({2.0f, 2.0f})));
}

TEST(AutogradChainTest, SgdStepAppliesTheGradient) {
  // One SGD step with lr 0.5 on f(p) = sum(p^2): p ← p - 0.5 · 2p = 0.
  auto p = torch::tensor({1.5f, -3.0f}, torch::requires_grad());
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.5));
  sgd.zero_grad();
  p.pow(2).sum().backward();
  sgd.step();
  EXPECT_TRUE(torch::equal(p.detach(), torch::zeros({2})));
}

}  // namespace
