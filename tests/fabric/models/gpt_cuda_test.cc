// fabric::models::GPT on a CUDA device (tag gpu; skips elsewhere): lm_loss on fp16 logits (the
// softmax kernel upcasting, no float32 copy) and on bf16 logits equals cross-entropy on a float32
// copy, value and gradient; the blocks' linear layers (ATen's linear, bias inside the GEMM) equal
// torch::nn::Linear's forward; a bf16-mixed step of the tiny model on the GPU lowers its loss; the
// fused output layer + cross-entropy (linear_cross_entropy, GPT::loss) equals the ATen path in
// value and gradients for bf16 and fp16, aligned and unaligned vocabularies, scaled losses, and
// with targets -100 (ignored: the mean over the other rows, zero gradient rows; NaN and zero
// gradients when every target is ignored) without waiting for the device.
// (The fused LayerNorm, RMSNorm, rotary and SwiGLU kernels: fused_ops_cuda_test; the float8
// linear's CUDA cases: tests/fabric/nn/fp8_cuda_test.)
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <vector>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

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
  const double diff =
      (a.grad().to(torch::kFloat) - b.grad().to(torch::kFloat)).abs().max().item<double>();
  const double scale = b.grad().to(torch::kFloat).abs().max().item<double>();
  EXPECT_LE(diff, scale / 128) << "gradients differ by more than one 16-bit step: " << diff;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LmLossTest, ::testing::Values(torch::kHalf, torch::kBFloat16));

struct FusedCase {
  torch::ScalarType dtype;
  int64_t vocab;  // 1000: 16-byte loads; 1003: one element at a time
};

class FusedCrossEntropyTest : public ::testing::TestWithParam<FusedCase> {};

// Runs loss(h, w) under CUDA autocast in `dtype`, backward with the loss scaled by 0.25 (as
// gradient accumulation does); returns {loss, dh, dw}.
std::vector<torch::Tensor> run_head(const torch::Tensor& h0, const torch::Tensor& w0,
                                    const torch::Tensor& targets, torch::ScalarType dtype,
                                    bool fused) {
  torch::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, dtype);
  EXPECT_EQ(fabric::models::fused_cross_entropy_applies(h), true);
  const torch::Tensor loss = fabric::models::linear_cross_entropy(h, w, targets, fused);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  (0.25 * loss).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

TEST_P(FusedCrossEntropyTest, EqualsTheLogitsThroughATen) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built())
    GTEST_SKIP() << "this build has no CUDA kernels (no nvcc at build time): nothing to compare";
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const int64_t V = GetParam().vocab, C = 64;
  const torch::Tensor h = torch::randn({4, 96, C}, opts);
  const torch::Tensor w = 0.3 * torch::randn({V, C}, opts);
  const torch::Tensor targets = torch::randint(0, V, {4, 96}, opts.dtype(torch::kLong));
  const auto fused = run_head(h, w, targets, GetParam().dtype, true);
  const auto aten = run_head(h, w, targets, GetParam().dtype, false);
  EXPECT_EQ(fused[0].scalar_type(), torch::kFloat);
  EXPECT_NEAR(fused[0].item<double>(), aten[0].item<double>(), 1e-5 * aten[0].item<double>());
  for (int i : {1, 2}) {
    ASSERT_EQ(fused[i].scalar_type(), torch::kFloat) << (i == 1 ? "dh" : "dw");
    const double diff = (fused[i] - aten[i]).abs().max().item<double>();
    const double scale = aten[i].abs().max().item<double>();
    EXPECT_LE(diff, scale / 64) << (i == 1 ? "dh" : "dw") << " differs by " << diff << " of "
                                << scale;
    EXPECT_GT(scale, 0);
  }
}

// Instruction fine-tuning's targets: -100 at prompt and padding positions (a third at random,
// and the first 40 positions of the first sequence). Both paths ignore them alike: the loss is
// the mean over the other rows, and an ignored row adds nothing to dh or dw. The fused forward
// runs with CUDA's sync debug mode set to raise, so it fails if the count of rows that are not
// ignored is brought to the host.
TEST_P(FusedCrossEntropyTest, IgnoresTargetsMinus100AsTheATenPath) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built())
    GTEST_SKIP() << "this build has no CUDA kernels (no nvcc at build time): nothing to compare";
  torch::manual_seed(1);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const int64_t V = GetParam().vocab, C = 64;
  const torch::Tensor h = torch::randn({4, 96, C}, opts);
  const torch::Tensor w = 0.3 * torch::randn({V, C}, opts);
  torch::Tensor targets = torch::randint(0, V, {4, 96}, opts.dtype(torch::kLong));
  targets.masked_fill_(torch::rand({4, 96}, opts) < 0.3, -100);
  targets.select(0, 0).narrow(0, 0, 40).fill_(-100);
  const torch::Tensor ignored = targets == -100;
#ifdef FABRIC_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  {
    torch::NoGradGuard no_grad;
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, GetParam().dtype);
    EXPECT_NO_THROW(fabric::models::linear_cross_entropy(h, w, targets))
        << "the fused forward synchronized with the host";
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
#endif
  const auto fused = run_head(h, w, targets, GetParam().dtype, true);
  const auto aten = run_head(h, w, targets, GetParam().dtype, false);
  ASSERT_FALSE(std::isnan(aten[0].item<double>()));
  EXPECT_NEAR(fused[0].item<double>(), aten[0].item<double>(), 1e-5 * aten[0].item<double>());
  for (int i : {1, 2}) {
    const double diff = (fused[i] - aten[i]).abs().max().item<double>();
    const double scale = aten[i].abs().max().item<double>();
    EXPECT_LE(diff, scale / 64) << (i == 1 ? "dh" : "dw") << " differs by " << diff << " of "
                                << scale;
    EXPECT_GT(scale, 0);
  }
  EXPECT_EQ(fused[1].index({ignored}).abs().max().item<double>(), 0)
      << "an ignored position has a gradient";
  // The mean is over the rows that are not ignored, not over all of them.
  const torch::Tensor kept = ignored.logical_not();
  const torch::Tensor over_kept = fabric::models::lm_loss(
      at::linear(h.index({kept}), w).to(GetParam().dtype), targets.index({kept}));
  EXPECT_NEAR(fused[0].item<double>(), over_kept.item<double>(), 1e-2 * over_kept.item<double>());
}

// Every target -100 (a micro-batch of prompt only): the fused loss is NaN (0 / 0), as
// at::cross_entropy_loss gives for float32 on the CPU, and the gradients are zero, as the ATen
// path's.
TEST_P(FusedCrossEntropyTest, EveryTargetMinus100GivesNaNAndZeroGradients) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built())
    GTEST_SKIP() << "this build has no CUDA kernels (no nvcc at build time): nothing to compare";
  torch::manual_seed(2);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const int64_t V = GetParam().vocab, C = 64;
  const torch::Tensor h = torch::randn({2, 16, C}, opts);
  const torch::Tensor w = 0.3 * torch::randn({V, C}, opts);
  const torch::Tensor targets = torch::full({2, 16}, -100, opts.dtype(torch::kLong));
  const auto fused = run_head(h, w, targets, GetParam().dtype, true);
  const auto aten = run_head(h, w, targets, GetParam().dtype, false);
  const torch::Tensor cpu =
      torch::cross_entropy_loss(torch::zeros({32, V}), targets.cpu().reshape({-1}));
  EXPECT_TRUE(std::isnan(cpu.item<double>())) << "ATen's loss on the CPU " << cpu.item<double>();
  EXPECT_TRUE(std::isnan(fused[0].item<double>())) << "the fused loss " << fused[0].item<double>();
  for (int i : {1, 2}) {
    EXPECT_EQ(aten[i].abs().max().item<double>(), 0) << (i == 1 ? "ATen's dh" : "ATen's dw");
    EXPECT_EQ(fused[i].abs().max().item<double>(), 0) << (i == 1 ? "fused dh" : "fused dw");
  }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndVocabularies, FusedCrossEntropyTest,
                         ::testing::Values(FusedCase{torch::kBFloat16, 1000},
                                           FusedCase{torch::kBFloat16, 1003},
                                           FusedCase{torch::kHalf, 1000}));

TEST(GPTCudaTest, FusedLossOfATargetOutsideTheVocabularyIsNaN) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const auto opts = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  const torch::Tensor h = torch::randn({2, 8}, opts), w = torch::randn({16, 8}, opts);
  const torch::Tensor targets = torch::tensor({3, 16}, torch::kLong).to(torch::kCUDA);
  EXPECT_TRUE(std::isnan(fabric::models::linear_cross_entropy(h, w, targets).item<double>()));
}

TEST(GPTCudaTest, GptLossEqualsForwardAndLmLoss) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  GPT model(GPTConfig::preset("tiny"));
  model->to(torch::kCUDA);
  const torch::Tensor w = torch::randint(0, 256, {4, 129}, torch::kLong).to(torch::kCUDA);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const torch::Tensor fused = model->loss(w.narrow(1, 0, 128), w.narrow(1, 1, 128));
  const torch::Tensor aten =
      fabric::models::lm_loss(model->forward(w.narrow(1, 0, 128)), w.narrow(1, 1, 128));
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  EXPECT_NEAR(fused.item<double>(), aten.item<double>(), 1e-5 * aten.item<double>());
}

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
  const torch::Tensor w =
      torch::arange(257, torch::kLong).remainder(17).view({1, 257}).repeat({4, 1}).to(torch::kCUDA);
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    const torch::Tensor loss = model->loss(w.narrow(1, 0, 256), w.narrow(1, 1, 256));
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << ", last " << last;
}

}  // namespace
