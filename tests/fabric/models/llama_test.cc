// fabric::models::Llama without Hugging Face (tests/fabric/hf/llama_test.cc compares it with
// transformers): sizes, the block hook, its tensor-parallel plan on 2 ranks (threads), and its
// float8 layers sharing their input's cast.
#include "fabric/models/llama.h"

#include <c10/util/intrusive_ptr.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8.h"
#include "tests/thread_ranks.h"

namespace {

using fabric::models::Llama;
using fabric::models::LlamaConfig;

LlamaConfig tiny(bool tied, int64_t kv_heads = 2) {
  LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = kv_heads;
  c.max_position_embeddings = 32;
  c.qkv_bias = true;
  c.tie_word_embeddings = tied;
  return c;
}

TEST(LlamaTest, ParametersCountsWhatTheModelHolds) {
  for (const bool tied : {false, true}) {
    LlamaConfig c = tiny(tied);
    c.attention_bias = !tied;
    Llama model(c);
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(c.parameters(), n) << tied;
    EXPECT_EQ(static_cast<bool>(model->lm_head), !tied);
  }
}

TEST(LlamaTest, RunBlockRunsEveryLayer) {
  torch::manual_seed(0);
  Llama model(tiny(false));
  const torch::Tensor ids = torch::randint(0, 64, {2, 8});
  int calls = 0;
  const torch::Tensor hooked =
      model->forward(ids, [&](fabric::models::LlamaDecoderLayer& layer, const torch::Tensor& x) {
        ++calls;
        return layer->forward(x);
      });
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(torch::equal(hooked, model->forward(ids)));
  EXPECT_THROW(model->forward(torch::randint(0, 64, {1, 33})), fabric::Error);
}

// tp 2, with and without sequence parallelism (7 tokens: padded to 8 inside forward), tied and
// untied: the whole model's logits and loss on both ranks, and the gradients of the whole (not
// split) RMSNorm weights, which sequence parallelism sums over the ranks.
TEST(LlamaTest, TensorParallelPlanOnTwoRanksGivesTheWholeModelsLogitsLossAndNormGradients) {
  for (const bool sequence_parallel : {false, true})
    for (const bool tied : {false, true}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "untied") + (sequence_parallel ? ", sp" : ""));
      torch::manual_seed(1);
      Llama whole(tiny(tied));
      const torch::Tensor ids = torch::randint(0, 64, {2, 8});
      const torch::Tensor inputs = ids.narrow(1, 0, 7), targets = ids.narrow(1, 1, 7);
      const torch::Tensor logits = whole->forward(inputs).detach();
      const torch::Tensor loss = whole->loss(inputs, targets);
      loss.backward();
      // Targets -100 (a prompt's, in instruction data) count nowhere, split vocabulary or not.
      const torch::Tensor masked = targets.clone();
      masked.narrow(1, 0, 4).fill_(-100);
      const torch::Tensor masked_loss = whole->loss(inputs, masked).detach();
      std::vector<Llama> copies;
      for (int r = 0; r < 2; ++r) {
        torch::manual_seed(1);
        copies.emplace_back(tiny(tied));
      }
      std::vector<torch::Tensor> got_logits(2), got_loss(2), got_masked(2);
      const auto errors = fabric::testing::on_thread_ranks(2, [&](int64_t rank, const auto& group) {
        Llama& model = copies[rank];
        auto plan = model->tensor_parallel_plan();
        plan.sequence_parallel = sequence_parallel;
        const auto split = fabric::nn::parallelize(*model, plan, group);
        // The embedding, 7 layers in each of 2 blocks, and an untied lm_head by vocabulary.
        EXPECT_EQ(split.size(), tied ? 15u : 16u);
        if (!tied) {
          EXPECT_EQ(model->lm_head->weight.size(0), 32);  // 32 of the 64 ids
        }
        EXPECT_EQ(model->layers[0]->self_attn->k_proj->weight.size(0), 8);  // 1 of 2 KV heads
        got_logits[rank] = model->forward(inputs).detach();
        got_masked[rank] = model->loss(inputs, masked).detach();
        const torch::Tensor l = model->loss(inputs, targets);
        l.backward();
        got_loss[rank] = l.detach();
      });
      ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << " | " << errors[1];
      for (int r = 0; r < 2; ++r) {
        EXPECT_LT((got_logits[r] - logits).abs().max().item<double>(),
                  1e-5 * logits.abs().max().item<double>());
        EXPECT_NEAR(got_loss[r].item<double>(), loss.item<double>(), 1e-5);
        EXPECT_NEAR(got_masked[r].item<double>(), masked_loss.item<double>(), 1e-5);
        EXPECT_GT(std::abs(masked_loss.item<double>() - loss.item<double>()), 1e-3);
        using fabric::models::LlamaImpl;
        using fabric::models::RMSNorm;
        const std::vector<std::pair<const char*, std::function<RMSNorm&(LlamaImpl&)>>> norms = {
            {"model.norm", [](LlamaImpl& m) -> RMSNorm& { return m.norm; }},
            {"layers.0.input_layernorm",
             [](LlamaImpl& m) -> RMSNorm& { return m.layers[0]->input_layernorm; }},
            {"layers.1.post_attention_layernorm",
             [](LlamaImpl& m) -> RMSNorm& { return m.layers[1]->post_attention_layernorm; }}};
        for (const auto& [name, of] : norms) {
          const torch::Tensor want = of(*whole)->weight.grad();
          EXPECT_LT((of(*copies[r])->weight.grad() - want).abs().max().item<double>(),
                    1e-5 * want.abs().max().item<double>())
              << name << " on rank " << r;
        }
      }
    }
}

// Under fp8-mixed q, k and v read one cast of their input (fabric::nn::shared_input_forward), and
// the MLP is one node (fabric::nn::swiglu_mlp: gate and up read one cast, the SwiGLU computed in
// the casts on CUDA). Against the same model whose k_proj and up_proj differ in fast_accumulation
// (which the CPU's GEMMs ignore, and which makes each layer cast for itself): two delayed-scaling
// training passes give the same losses, gradients and histories, bitwise.
TEST(LlamaTest, Fp8LayersReadingOneInputShareItsCast) {
  torch::manual_seed(3);
  Llama shared(tiny(false)), separate(tiny(false));
  {
    torch::NoGradGuard no_grad;
    const auto from = shared->parameters(), to = separate->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  const auto fp8 = fabric::nn::Fp8Scaling::kDelayed;
  fabric::nn::convert_to_fp8(*shared, {}, fp8, 4);
  fabric::nn::convert_to_fp8(*separate, {}, fp8, 4);
  for (auto& l : separate->layers) {
    l->self_attn->k_proj->set_fp8(true, fp8, 4, /*fast_accumulation=*/false);
    l->mlp->up_proj->set_fp8(true, fp8, 4, /*fast_accumulation=*/false);
  }
  const torch::Tensor ids = torch::randint(0, 64, {2, 8}), targets = torch::randint(0, 64, {2, 8});
  for (int step = 0; step < 2; ++step) {
    shared->zero_grad();
    separate->zero_grad();
    const torch::Tensor a = shared->loss(ids, targets), b = separate->loss(ids, targets);
    a.backward();
    b.backward();
    EXPECT_TRUE(torch::equal(a, b))
        << "step " << step << ": " << a.item<float>() << " vs " << b.item<float>();
    const auto pa = shared->named_parameters(), pb = separate->named_parameters();
    for (const auto& item : pa) {
      const torch::Tensor &ga = item.value().grad(), &gb = pb[item.key()].grad();
      EXPECT_TRUE(torch::equal(ga, gb)) << item.key() << ", step " << step;
    }
  }
  for (size_t i = 0; i < shared->layers.size(); ++i) {
    auto &la = shared->layers[i], &lb = separate->layers[i];
    for (const auto& [x, y] : {std::pair{la->self_attn->q_proj, lb->self_attn->q_proj},
                               std::pair{la->self_attn->k_proj, lb->self_attn->k_proj},
                               std::pair{la->self_attn->v_proj, lb->self_attn->v_proj},
                               std::pair{la->mlp->gate_proj, lb->mlp->gate_proj},
                               std::pair{la->mlp->up_proj, lb->mlp->up_proj},
                               std::pair{la->mlp->down_proj, lb->mlp->down_proj}})
      EXPECT_TRUE(torch::equal(x->fp8_history()->amax, y->fp8_history()->amax)) << "layer " << i;
  }
  // (The MLP's node: the one SwiGLU node, or the separate layers.)
  const torch::Tensor h = torch::randn({2, 8, shared->layers[0]->mlp->gate_proj->weight.size(1)});
  auto mlp_node = [&](Llama& m) { return m->layers[0]->mlp->forward(h).grad_fn()->name(); };
  EXPECT_NE(mlp_node(shared).find("Fp8SwigluMlp"), std::string::npos) << mlp_node(shared);
  EXPECT_EQ(mlp_node(separate).find("Fp8SwigluMlp"), std::string::npos) << mlp_node(separate);
}

TEST(LlamaTest, ATpThatSplitsAKeyValueHeadIsAOneLineError) {
  std::vector<Llama> copies{Llama(tiny(false, 1)), Llama(tiny(false, 1))};
  const auto errors = fabric::testing::on_thread_ranks(2, [&](int64_t rank, const auto& group) {
    fabric::nn::parallelize(*copies[rank], copies[rank]->tensor_parallel_plan(), group);
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("model.layers.*.self_attn.k_proj"), std::string::npos) << e;
    EXPECT_NE(e.find("key/value heads (num_key_value_heads)"), std::string::npos) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  std::cout << "error: " << errors[0] << "\n";
}

}  // namespace
