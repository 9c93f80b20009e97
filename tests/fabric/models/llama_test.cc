// fabric::models::Llama without Hugging Face (tests/fabric/hf/llama_test.cc compares it with
// transformers): sizes, the block hook, and its tensor-parallel plan on 2 ranks (threads).
#include "fabric/models/llama.h"

#include <c10/util/intrusive_ptr.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>
#include <thread>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

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

// Both ranks of a tp 2 group (threads over one store) run `fn(rank, group)`; errors come back.
std::vector<std::string> on_two_ranks(
    const std::function<void(int64_t, const c10::intrusive_ptr<c10d::ProcessGroup>&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int64_t rank = 0; rank < 2; ++rank)
    threads.emplace_back([&, rank] {
      try {
        fabric::distributed::ProcessGroupOptions options;
        options.rank = rank;
        options.world_size = 2;
        options.cpu_backend = fabric::distributed::CpuBackend::kGloo;
        fn(rank, fabric::distributed::make_process_group(store, options));
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(LlamaTest, TensorParallelPlanOnTwoRanksGivesTheWholeModelsLogitsAndLoss) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    torch::manual_seed(1);
    Llama whole(tiny(tied));
    const torch::Tensor ids = torch::randint(0, 64, {2, 9});
    const torch::Tensor inputs = ids.narrow(1, 0, 8), targets = ids.narrow(1, 1, 8);
    const torch::Tensor logits = whole->forward(inputs).detach();
    const torch::Tensor loss = whole->loss(inputs, targets).detach();
    std::vector<Llama> copies;
    for (int r = 0; r < 2; ++r) {
      torch::manual_seed(1);
      copies.emplace_back(tiny(tied));
    }
    std::vector<torch::Tensor> got_logits(2), got_loss(2);
    const auto errors = on_two_ranks([&](int64_t rank, const auto& group) {
      Llama& model = copies[rank];
      const auto split = fabric::nn::parallelize(*model, model->tensor_parallel_plan(), group);
      // The embedding, 7 layers in each of 2 blocks, and an untied lm_head by vocabulary.
      EXPECT_EQ(split.size(), tied ? 15u : 16u);
      if (!tied) EXPECT_EQ(model->lm_head->weight.size(0), 32);           // 32 of the 64 ids
      EXPECT_EQ(model->layers[0]->self_attn->k_proj->weight.size(0), 8);  // 1 of 2 KV heads
      got_logits[rank] = model->forward(inputs).detach();
      got_loss[rank] = model->loss(inputs, targets).detach();
    });
    ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << " | " << errors[1];
    for (int r = 0; r < 2; ++r) {
      EXPECT_LT((got_logits[r] - logits).abs().max().item<double>(),
                1e-5 * logits.abs().max().item<double>());
      EXPECT_NEAR(got_loss[r].item<double>(), loss.item<double>(), 1e-5);
    }
  }
}

TEST(LlamaTest, ATpThatSplitsAKeyValueHeadIsAOneLineError) {
  std::vector<Llama> copies{Llama(tiny(false, 1)), Llama(tiny(false, 1))};
  const auto errors = on_two_ranks([&](int64_t rank, const auto& group) {
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
