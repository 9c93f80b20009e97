// LoRA adapters on split fabric::nn::Linear layers (issue 70), two ranks as threads of this
// process over Gloo: the split block computes and trains as the whole one. Split out of
// tensor_parallel_test.cc, which tests the layers and plans without adapters.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>
#include <vector>

#include "fabric/nn/lora.h"
#include "fabric/nn/tensor_parallel.h"
#include "tests/thread_ranks.h"

namespace {

using fabric::nn::TensorParallelPlan;
using fabric::nn::TensorParallelStyle;

// A fused qkv (column(3)) and a projection (row), LoRA on both.
struct LoraBlock : torch::nn::Module {
  LoraBlock() {
    qkv = register_module("qkv", fabric::nn::Linear(8, 24));
    proj = register_module("proj", fabric::nn::Linear(8, 6));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto parts = qkv->forward(x).chunk(3, -1);
    return proj->forward(parts[0] * parts[1] + parts[2]);
  }
  fabric::nn::Linear qkv{nullptr}, proj{nullptr};
};

std::shared_ptr<LoraBlock> lora_block(bool adapters) {
  torch::manual_seed(1);
  auto b = std::make_shared<LoraBlock>();
  if (adapters) {
    b->qkv->set_lora(2, 1.5, 0.0);
    b->proj->set_lora(2, 1.5, 0.0);
  }
  return b;
}

// What a rank (or the whole block) computed; the adapters' gradients whole.
struct LoraRun {
  torch::Tensor y, dx, merged_y;
  std::vector<std::pair<std::string, torch::Tensor>> grads, state, unsplit;
  std::vector<int64_t> qkv_b, qkv_a, proj_a, proj_b;  // the adapters' sizes while split
  std::vector<bool> cut;                              // is_split_parameter: qkv's A, B, proj's A, B
};

// LoRA on split layers (issue 70), two ranks as threads of this process (Gloo): the block
// computes and trains as the whole one does (output, input gradient, the adapters' gradients
// gathered whole, within 1e-5), with and without sequence parallelism, with the adapters added
// before the split (set_parallel cuts them) or after it (set_lora cuts them); B of the fused
// layer is cut by the weight's parts, A of the row layer by columns; lora_state gathers them
// whole, unparallelize makes them whole, merge_lora folds each rank's slice into its weight.
// No dropout: threads of one process share one generator (finetune_example_test runs it in
// real processes).
TEST(TensorParallelTest, LoraOnSplitLayersTrainsAsTheWholeLayer) {
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({2, 4, 8}), w = torch::randn({2, 4, 6});
  // The whole block, its adapters' B moved off zero (so both adapters' gradients are not zero).
  auto whole = lora_block(true);
  {
    torch::NoGradGuard no_grad;
    whole->qkv->lora_B->weight.normal_();
    whole->proj->lora_B->weight.normal_();
  }
  const auto state = fabric::nn::lora_state(*whole);
  LoraRun ref;
  {
    const torch::Tensor in = x.clone().requires_grad_();
    ref.y = whole->forward(in);
    (ref.y * w).sum().backward();
    ref.dx = in.grad();
    for (auto& p : whole->named_parameters())
      if (p.key().find("lora_") != std::string::npos) ref.grads.emplace_back(p.key(), p->grad());
  }
  for (bool sp : {false, true}) {
    for (bool after : {false, true}) {
      SCOPED_TRACE(std::string(sp ? "sequence parallel, " : "") +
                   (after ? "adapters after the split" : "adapters before the split"));
      std::vector<LoraRun> runs(2);
      std::vector<std::shared_ptr<LoraBlock>> blocks = {lora_block(!after), lora_block(!after)};
      const auto errors = fabric::testing::on_thread_ranks(2, [&](int64_t rank, const auto& group) {
        LoraRun& r = runs[rank];
        LoraBlock& b = *blocks[rank];
        TensorParallelPlan plan{
            {{"qkv", TensorParallelStyle::column(3)}, {"proj", TensorParallelStyle::row()}}};
        plan.sequence_parallel = sp;
        fabric::nn::parallelize(b, plan, group);
        if (after) {
          b.qkv->set_lora(2, 1.5, 0.0);
          b.proj->set_lora(2, 1.5, 0.0);
        }
        fabric::nn::load_lora_state(b, state);  // whole tensors: this rank's slices kept
        r.qkv_a = b.qkv->lora_A->weight.sizes().vec();
        r.qkv_b = b.qkv->lora_B->weight.sizes().vec();
        r.proj_a = b.proj->lora_A->weight.sizes().vec();
        r.proj_b = b.proj->lora_B->weight.sizes().vec();
        for (const auto* t : {&b.qkv->lora_A->weight, &b.qkv->lora_B->weight,
                              &b.proj->lora_A->weight, &b.proj->lora_B->weight})
          r.cut.push_back(fabric::nn::is_split_parameter(b, *t));
        const auto& shard = b.qkv->parallel();
        const torch::Tensor in = x.clone().requires_grad_();
        r.y = fabric::nn::leave_sequence_parallel(
            b.forward(fabric::nn::enter_sequence_parallel(in, shard)), shard);
        (r.y * w).sum().backward();
        r.dx = in.grad();
        r.grads = {
            {"qkv.lora_A.weight", b.qkv->lora_A->weight.grad()},
            {"qkv.lora_B.weight", shard->gather(b.qkv->lora_B->weight.grad(), 0)},
            {"proj.lora_A.weight", b.proj->parallel()->gather(b.proj->lora_A->weight.grad(), 1)},
            {"proj.lora_B.weight", b.proj->lora_B->weight.grad()}};
        r.state = fabric::nn::lora_state(b);  // collective: gathered whole
        // Whole again, adapters too; split again (set_parallel cuts the adapters), merged.
        fabric::nn::unparallelize(b);
        for (auto& p : b.named_parameters())
          if (p.key().find("lora_") != std::string::npos)
            r.unsplit.emplace_back(p.key(), p->detach().clone());
        fabric::nn::parallelize(b, plan, group);
        fabric::nn::merge_lora(b);
        torch::NoGradGuard no_grad;
        r.merged_y = fabric::nn::leave_sequence_parallel(
            b.forward(fabric::nn::enter_sequence_parallel(x, b.qkv->parallel())),
            b.qkv->parallel());
      });
      ASSERT_EQ(errors, std::vector<std::string>(2)) << errors[0] << " | " << errors[1];
      for (const LoraRun& r : runs) {
        EXPECT_EQ(r.qkv_a, (std::vector<int64_t>{2, 8}));  // whole
        EXPECT_EQ(r.qkv_b, (std::vector<int64_t>{12, 2}));
        EXPECT_EQ(r.proj_a, (std::vector<int64_t>{2, 4}));
        EXPECT_EQ(r.proj_b, (std::vector<int64_t>{6, 2}));  // whole
        EXPECT_EQ(r.cut, (std::vector<bool>{false, true, true, false}));
        EXPECT_TRUE(torch::allclose(r.y, ref.y, 1e-5, 1e-5));
        EXPECT_TRUE(torch::allclose(r.dx, ref.dx, 1e-5, 1e-5));
        EXPECT_TRUE(torch::allclose(r.merged_y, ref.y, 1e-5, 1e-5));
        ASSERT_EQ(r.grads.size(), ref.grads.size());
        for (size_t i = 0; i < ref.grads.size(); ++i) {
          EXPECT_EQ(r.grads[i].first, ref.grads[i].first);
          EXPECT_GT(ref.grads[i].second.abs().max().item<double>(), 1e-3);
          EXPECT_TRUE(torch::allclose(r.grads[i].second, ref.grads[i].second, 1e-5, 1e-5))
              << ref.grads[i].first;
        }
        ASSERT_EQ(r.state.size(), state.size());
        for (size_t i = 0; i < state.size(); ++i) {
          EXPECT_EQ(r.state[i].first, state[i].first);
          EXPECT_TRUE(torch::equal(r.state[i].second, state[i].second)) << state[i].first;
        }
        ASSERT_EQ(r.unsplit.size(), state.size());
        for (size_t i = 0; i < state.size(); ++i)
          EXPECT_TRUE(torch::equal(r.unsplit[i].second, state[i].second)) << r.unsplit[i].first;
      }
    }
  }
}

}  // namespace
