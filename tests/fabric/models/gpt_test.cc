// fabric::models::GPT: causal (no position sees a later token), attention equal to a hand-written
// masked softmax, GPT-2's initialization, the tied output projection counted once, the parameter
// count of the presets, blocks named for fsdp, and a tiny model that learns a repeating text.
#include "fabric/models/gpt.h"

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <string>

#include "fabric/core/error.h"
#include "fabric/nn/empty_init.h"
#include "fabric/nn/module_type.h"

namespace {

using fabric::models::GPT;
using fabric::models::GPTConfig;

GPTConfig small() {
  GPTConfig c = GPTConfig::preset("tiny");
  c.block_size = 16;
  c.n_layer = 2;
  c.n_embd = 32;
  return c;
}

TEST(GPTTest, NoPositionSeesALaterToken) {
  torch::manual_seed(0);
  GPT model(small());
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor a = torch::randint(0, 256, {2, 16}, torch::kLong);
  torch::Tensor b = a.clone();
  b.narrow(1, 9, 7).random_(0, 256);  // change tokens 9..15 only
  const torch::Tensor la = model->forward(a), lb = model->forward(b);
  EXPECT_TRUE(torch::allclose(la.narrow(1, 0, 9), lb.narrow(1, 0, 9), 0, 0));
  EXPECT_FALSE(torch::allclose(la.narrow(1, 9, 7), lb.narrow(1, 9, 7)));
}

TEST(GPTTest, AttentionEqualsAMaskedSoftmaxWrittenOut) {
  torch::manual_seed(1);
  GPTConfig c = small();
  fabric::models::CausalSelfAttention attn(c);
  attn->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor x = torch::randn({2, 16, 32});
  const auto qkv = attn->c_attn->forward(x).split(32, 2);
  auto heads = [](const torch::Tensor& t) { return t.view({2, 16, 4, 8}).transpose(1, 2); };
  torch::Tensor scores =
      torch::matmul(heads(qkv[0]), heads(qkv[1]).transpose(-2, -1)) / std::sqrt(8.0);
  scores = scores.masked_fill(torch::ones({16, 16}, torch::kBool).triu(1), -INFINITY);
  torch::Tensor y = torch::matmul(scores.softmax(-1), heads(qkv[2]));
  y = attn->c_proj->forward(y.transpose(1, 2).contiguous().view({2, 16, 32}));
  EXPECT_TRUE(torch::allclose(attn->forward(x), y, 1e-5, 1e-5));
}

TEST(GPTTest, Gpt2InitializationAndOneTiedProjection) {
  torch::manual_seed(2);
  GPTConfig c = GPTConfig::preset("tiny");
  c.n_layer = 8;
  GPT model(c);
  int64_t total = 0;
  for (const auto& p : model->named_parameters()) {
    total += p.value().numel();
    EXPECT_EQ(p.key().find("lm_head"), std::string::npos) << p.key();
  }
  EXPECT_EQ(total, c.parameters());
  const double residual = 0.02 / std::sqrt(16.0);
  EXPECT_NEAR(model->blocks[3]->attn->c_proj->weight.std().item<double>(), residual,
              0.1 * residual);
  EXPECT_NEAR(model->blocks[3]->mlp->c_proj->weight.std().item<double>(), residual, 0.1 * residual);
  EXPECT_NEAR(model->blocks[3]->mlp->c_fc->weight.std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(model->wte->weight.std().item<double>(), 0.02, 0.002);
  EXPECT_EQ(model->blocks[0]->attn->c_attn->bias.abs().max().item<double>(), 0.0);
  // The output projection is the token embedding: changing one row of wte changes that logit.
  model->eval();
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::zeros({1, 4}, torch::kLong);
  const torch::Tensor before = model->forward(tokens);
  model->wte->weight[7].add_(1.0);
  const torch::Tensor after = model->forward(tokens);
  EXPECT_FALSE(torch::allclose(before.select(2, 7), after.select(2, 7)));
  EXPECT_EQ(fabric::module_type_stem(model->blocks[0]->name()), "Block");  // fsdp wrap_modules
  EXPECT_EQ(model->named_parameters().find("transformer.h.1.attn.c_attn.weight") != nullptr, true);
}

// Built under an empty init (no parameter memory) and materialised: the values of a full
// construction with the same seed, bit for bit.
TEST(GPTTest, AnEmptyInitMaterialisesAFullInitsWeights) {
  torch::manual_seed(11);
  GPT full(small());
  torch::manual_seed(11);
  GPT empty{nullptr};
  std::shared_ptr<fabric::InitRecord> record;
  {
    fabric::EmptyInit scope;
    empty = GPT(small());
    record = scope.record();
  }
  for (const auto& p : empty->parameters()) ASSERT_TRUE(p.is_meta());
  fabric::materialize(*empty, *record, torch::kCPU);
  const auto expected = full->named_parameters();
  for (const auto& p : empty->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), expected[p.key()])) << p.key();
  for (const auto& b : full->named_buffers())
    EXPECT_TRUE(torch::equal(b.value(), empty->named_buffers()[b.key()])) << b.key();
}

TEST(GPTTest, PresetsHaveGpt2sSizes) {
  // GPT-2 with its own vocabulary of 50257: 124,439,808 parameters (medium: 354,823,168, large:
  // 774,030,080, xl: 1,557,611,200, as Hugging Face's checkpoints of them hold).
  GPTConfig gpt2 = GPTConfig::preset("gpt2"), medium = GPTConfig::preset("gpt2-medium"),
            large = GPTConfig::preset("gpt2-large"), xl = GPTConfig::preset("gpt2-xl");
  gpt2.vocab_size = medium.vocab_size = large.vocab_size = xl.vocab_size = 50257;
  EXPECT_EQ(gpt2.parameters(), 124439808);
  EXPECT_EQ(medium.parameters(), 354823168);
  EXPECT_EQ(large.parameters(), 774030080);
  EXPECT_EQ(xl.parameters(), 1557611200);
  EXPECT_THROW(GPTConfig::preset("gpt3"), fabric::Error);
  GPT model(small());
  EXPECT_THROW(model->forward(torch::zeros({1, 17}, torch::kLong)), fabric::Error);
}

TEST(GPTTest, ATinyModelLearnsARepeatingText) {
  torch::manual_seed(3);
  GPT model(small());
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(3e-3));
  const torch::Tensor text =
      torch::arange(0, 17, torch::kLong).remainder(5).unsqueeze(0).repeat({4, 1});
  const torch::Tensor x = text.narrow(1, 0, 16), y = text.narrow(1, 1, 16);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = model->loss(x, y);
    if (step == 0) {  // on a CPU, loss() is the logits through ATen: the same numbers
      EXPECT_FALSE(fabric::models::fused_cross_entropy_applies(x.to(torch::kFloat)));
      EXPECT_TRUE(torch::equal(loss, fabric::models::lm_loss(model->forward(x), y)));
    }
    loss.backward();
    optimizer.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_NEAR(first, std::log(256.0), 0.5);  // uniform over the vocabulary at the start
  EXPECT_LT(last, 0.5) << "first " << first;
}

}  // namespace
