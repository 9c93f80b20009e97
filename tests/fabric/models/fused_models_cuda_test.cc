// The GPT and a Llama built with the fused CUDA kernels (fused_ops_cuda_test tests the kernels)
// on a CUDA device (tag gpu; skips elsewhere): a tiny GPT's and a tiny Llama's loss and gradients
// with them equal the ATen ones, steps with them leave no memory behind, and under fp8-mixed with
// delayed scaling a GPT block's fused LayerNorms and a Llama layer's fused RMSNorms write their
// Linears' float8 inputs bitwise as the Linears' own casts.
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/utils.h>

#include <vector>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "fabric/models/fused_cross_entropy.h"
#include "fabric/models/fused_layer_norm.h"
#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/tensor_parallel.h"
#include "tests/cuda_skip.h"
#include "tests/fabric/models/cuda_autocast.h"

namespace {

using fabric::models::GPT;
using fabric::models::GPTConfig;
using fabric::testing::autocast_off;
using fabric::testing::autocast_on;
using fabric::testing::max_rel;

// Copies `fused`'s parameters into `aten` (on the GPU), then expects one bf16-autocast loss of
// random ids (vocabulary 256, 4 x 128) and every gradient to agree.
template <typename Model>
void expect_same_loss_and_gradients(Model& fused, Model& aten) {
  fused->to(torch::kCUDA);
  aten->to(torch::kCUDA);
  {
    torch::NoGradGuard no_grad;
    const auto from = fused->parameters();
    const auto to = aten->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  const torch::Tensor w = torch::randint(0, 256, {4, 129}, torch::kLong).to(torch::kCUDA);
  autocast_on(torch::kBFloat16);
  const torch::Tensor a = fused->loss(w.narrow(1, 0, 128), w.narrow(1, 1, 128));
  const torch::Tensor b = aten->loss(w.narrow(1, 0, 128), w.narrow(1, 1, 128));
  autocast_off();
  EXPECT_NEAR(a.item<double>(), b.item<double>(), 1e-3 * b.item<double>());
  a.backward();
  b.backward();
  const auto ga = fused->named_parameters();
  const auto gb = aten->parameters();
  for (size_t i = 0; i < gb.size(); ++i)
    EXPECT_LE(max_rel(ga[i].value().grad(), gb[i].grad()), 0.05) << ga[i].key();
}

// A tiny Llama's loss and gradients with the fused RMSNorms, rotary embedding and SwiGLU
// (LlamaConfig::fused_norm, fused_elementwise) against the ATen ones, bf16 autocast.
TEST(GPTCudaTest, FusedRmsNormLlamaLossEqualsTheATenOne) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  torch::manual_seed(0);
  fabric::models::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 128;
  c.fused_norm = c.fused_elementwise = true;
  fabric::models::Llama fused(c);
  c.fused_norm = c.fused_elementwise = false;
  fabric::models::Llama aten(c);
  expect_same_loss_and_gradients(fused, aten);
}

TEST(GPTCudaTest, FusedLayerNormGptLossEqualsTheATenOne) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(0);
  GPTConfig c = GPTConfig::preset("tiny");
  c.fused_layer_norm = true;
  GPT fused(c);
  c.fused_layer_norm = false;
  GPT aten(c);
  expect_same_loss_and_gradients(fused, aten);
}

// The fused functions keep nothing alive after a step: an output kept in its own node's context
// would hold the step's graph (it did, before h was saved detached: 71 GB after 55 GPT-2 steps).
TEST(GPTCudaTest, FusedLayerNormStepsLeaveNoMemoryBehind) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
#ifdef FABRIC_WITH_CUDA
  torch::manual_seed(0);
  GPTConfig c = GPTConfig::preset("tiny");
  c.fused_layer_norm = true;
  GPT model(c);
  model->to(torch::kCUDA);
  const torch::Tensor w = torch::randint(0, 256, {4, 129}, torch::kLong).to(torch::kCUDA);
  auto step = [&] {
    autocast_on(torch::kBFloat16);
    const torch::Tensor loss = model->loss(w.narrow(1, 0, 128), w.narrow(1, 1, 128));
    autocast_off();
    loss.backward();
    model->zero_grad();
  };
  auto allocated = [] {
    torch::cuda::synchronize();
    return c10::cuda::CUDACachingAllocator::getDeviceStats(0)
        .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .current;
  };
  step();
  step();
  const int64_t before = allocated();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(allocated(), before) << "bytes left allocated by 5 more steps";
#endif
}

class FusedBlockFp8Test : public ::testing::TestWithParam<torch::ScalarType> {};

// Deterministic algorithms on (warnings only where an operator has none) for a scope.
struct DeterministicScope {
  DeterministicScope()
      : was(at::globalContext().deterministicAlgorithms()),
        warn_only(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  ~DeterministicScope() { at::globalContext().setDeterministicAlgorithms(was, warn_only); }
  DeterministicScope(const DeterministicScope&) = delete;
  DeterministicScope& operator=(const DeterministicScope&) = delete;
  bool was, warn_only;
};

// Three training steps of two copies of a block under `t` autocast (the first seeds the delayed
// histories, the norms write float8 in the other two), SGD between them: `a` through its forward,
// `b` through `composed` (its 16-bit norms, each Linear casting its input itself); output, input
// gradient, every parameter's gradient and the histories bitwise. Input [2, 128, width].
template <typename Block, typename Composed>
void expect_same_steps(Block& a, Block& b, torch::ScalarType t, int64_t width,
                       const Composed& composed) {
  const auto on = torch::TensorOptions().device(torch::kCUDA);
  const torch::Tensor x0 = torch::randn({2, 128, width}, on), r = torch::randn({2, 128, width}, on);
  // Attention's backward may sum a query's gradient over key blocks in any order (atomics): the
  // deterministic kernels, so that the two sides differ only where the norms do.
  const DeterministicScope deterministic;
  for (int step = 0; step < 3; ++step) {
    auto run = [&](bool produced) {
      Block& blk = produced ? a : b;
      torch::Tensor x = (x0 * (1 + 0.5 * step)).requires_grad_();
      autocast_on(t);
      const torch::Tensor out = produced ? blk->forward(x) : composed(*blk, x);
      autocast_off();
      (out.to(torch::kFloat) * r).sum().backward();
      std::vector<torch::Tensor> res = {out.detach(), x.grad()};
      torch::NoGradGuard no_grad;
      for (auto& p : blk->parameters()) {
        res.push_back(p.grad().clone());
        p.sub_(p.grad() * 1e-3);
        p.mutable_grad().reset();
      }
      for (const auto& m : blk->modules()) {
        auto* l = dynamic_cast<fabric::nn::LinearImpl*>(m.get());
        if (l != nullptr && l->fp8_history()) res.push_back(l->fp8_history()->amax.clone());
      }
      return res;
    };
    const auto pa = run(true), pb = run(false);
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i)
      EXPECT_TRUE(torch::equal(pa[i], pb[i]))
          << "step " << step << ", tensor " << i << ": max difference "
          << (pa[i].to(torch::kFloat) - pb[i].to(torch::kFloat)).abs().max().template item<float>();
  }
}

// expect_same_steps for two blocks from make(scaling), delayed, then tensorwise.
template <typename Make, typename Composed>
void expect_same_steps_both_recipes(const Make& make, torch::ScalarType t, int64_t width,
                                    const Composed& composed) {
  for (const auto scaling :
       {fabric::nn::Fp8Scaling::kDelayed, fabric::nn::Fp8Scaling::kTensorwise}) {
    SCOPED_TRACE(scaling == fabric::nn::Fp8Scaling::kDelayed ? "delayed" : "tensorwise");
    auto a = make(scaling), b = make(scaling);
    expect_same_steps(a, b, t, width, composed);
  }
}

// fp8-mixed with delayed scaling: a GPT block whose fused LayerNorms write c_attn's and c_fc's
// float8 inputs themselves (BlockImpl::forward, through fabric::nn::produced_forward) against the
// same block composed with the 16-bit norms (expect_same_steps); with tensorwise scaling, the
// norms write their 16-bit outputs and take their amaxes, which the Linears' casts read. The
// width of gpt2-medium.
TEST_P(FusedBlockFp8Test, Fp8BlockNormsWriteTheLinearsInputsAsTheirOwnCasts) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  if (!fabric::nn::fp8_supported(torch::Device(torch::kCUDA)))
    GTEST_SKIP() << "no float8 GEMMs on this device";
  GPTConfig c;
  c.n_embd = 1024;
  c.n_head = 16;
  auto make = [&](fabric::nn::Fp8Scaling scaling) {  // the same weights, each its own histories
    torch::manual_seed(12);
    fabric::models::Block blk(c);
    blk->to(torch::kCUDA);
    fabric::nn::convert_to_fp8(*blk, {}, scaling, 4);
    return blk;
  };
  expect_same_steps_both_recipes(
      make, GetParam(), 1024, [](fabric::models::BlockImpl& blk, const torch::Tensor& x) {
        const auto [x1, y1] = fabric::models::keep_layer_norm_16(x, blk.ln_1);
        const auto [h, y] = fabric::models::add_layer_norm_16(x1, blk.attn->forward(y1), blk.ln_2);
        return h + blk.mlp->forward(y);
      });
}

// The same for a Llama decoder layer of Llama 3.2 1B's shape (width 2048, 32 query and 8
// key/value heads, SwiGLU 8192): its fused RMSNorms write the one float8 input q, k and v share
// (fabric::nn::shared_input_forward) and the one gate and up share (fabric::nn::swiglu_mlp's
// node) against the layer composed with the 16-bit norms; tensorwise, their amaxes.
TEST_P(FusedBlockFp8Test, Fp8LlamaNormsWriteTheSharedInputsAsTheirOwnCasts) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  if (!fabric::nn::fp8_supported(torch::Device(torch::kCUDA)))
    GTEST_SKIP() << "no float8 GEMMs on this device";
  fabric::models::LlamaConfig c;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.fused_norm = c.fused_elementwise = true;
  auto make = [&](fabric::nn::Fp8Scaling scaling) {
    torch::manual_seed(12);
    fabric::models::LlamaDecoderLayer layer(c);
    layer->to(torch::kCUDA);
    fabric::nn::convert_to_fp8(*layer, {}, scaling, 4);
    return layer;
  };
  expect_same_steps_both_recipes(
      make, GetParam(), 2048, [](fabric::models::LlamaDecoderLayerImpl& l, const torch::Tensor& x) {
        const auto& n1 = l.input_layernorm;
        const auto& n2 = l.post_attention_layernorm;
        const auto [x1, y1] = fabric::models::keep_rms_norm_16(x, n1->weight, n1->eps());
        const auto [h, y] =
            fabric::models::add_rms_norm_16(x1, l.self_attn->forward(y1), n2->weight, n2->eps());
        return h + l.mlp->forward(y);
      });
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedBlockFp8Test,
                         ::testing::Values(torch::kBFloat16, torch::kHalf));

}  // namespace
