// fabric::nn::BatchNorm*d and convert_sync_batchnorm in one process (multi-rank parity lives in
// tests/integration/sync_batchnorm_test.cc): drop-in compatibility with torch::nn::BatchNorm*d,
// the synchronized math on a one-rank group against torch's, and what conversion swaps, keeps and
// refuses.
#include "fabric/nn/batch_norm.h"

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> one_rank_group() {
  static auto group = [] {
    fabric::distributed::StoreOptions store;
    store.is_server = true;
    auto s = fabric::distributed::make_store(store);
    return fabric::distributed::make_process_group(s, {});
  }();
  return group;
}

std::vector<std::string> keys(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.key());
  for (const auto& b : m.named_buffers()) out.push_back(b.key());
  return out;
}

TEST(BatchNormTest, SameOptionsStateKeysAndForwardAsTorch) {
  auto options = torch::nn::BatchNormOptions(4).momentum(std::nullopt).eps(1e-3);
  torch::nn::BatchNorm2d theirs(options);
  fabric::nn::BatchNorm2d mine(options);
  EXPECT_EQ(keys(*mine), keys(*theirs));
  torch::manual_seed(0);
  auto x = torch::randn({5, 4, 3, 3});
  EXPECT_TRUE(torch::allclose(mine(x), theirs(x)));
  EXPECT_TRUE(torch::allclose(mine(x * 2), theirs(x * 2)));  // cumulative average (momentum None)
  EXPECT_TRUE(torch::allclose(mine->running_var, theirs->running_var));
  EXPECT_EQ(mine->num_batches_tracked.item<int64_t>(), 2);
  EXPECT_THROW(mine(torch::randn({5, 4})), fabric::Error);
}

// The synchronized path on one rank is BatchNorm: checks the CPU math (forward, all three
// gradients, running statistics) in float and double.
TEST(BatchNormTest, SynchronizedMathEqualsTorchBatchNorm) {
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    torch::manual_seed(1);
    auto x = (torch::randn({6, 3, 4}, dtype) * 2 + 1).requires_grad_(true);
    auto ref_x = x.detach().clone().requires_grad_(true);
    auto w = torch::randn({6, 3, 4}, dtype);
    torch::nn::BatchNorm1d ref(torch::nn::BatchNormOptions(3).momentum(0.2));
    ref->to(dtype);
    auto weight = (torch::rand({3}, dtype) + 0.5).requires_grad_(true);
    auto bias = torch::randn({3}, dtype).requires_grad_(true);
    {
      torch::NoGradGuard no_grad;
      ref->weight.copy_(weight);
      ref->bias.copy_(bias);
    }
    fabric::nn::detail::SyncBatchNormArgs args;
    args.running_mean = torch::zeros({3}, dtype);
    args.running_var = torch::ones({3}, dtype);
    args.momentum = 0.2;
    args.group = fabric::nn::detail::make_group(one_rank_group());
    auto y = fabric::nn::detail::sync_batch_norm(x, weight, bias, args);
    auto ref_y = ref(ref_x);
    (y * w).sum().backward();
    (ref_y * w).sum().backward();
    const double tol = dtype == torch::kDouble ? 1e-12 : 1e-5;
    EXPECT_LT((y - ref_y).abs().max().item<double>(), tol);
    EXPECT_LT((x.grad() - ref_x.grad()).abs().max().item<double>(), tol);
    EXPECT_LT((weight.grad() - ref->weight.grad()).abs().max().item<double>(), tol);
    EXPECT_LT((bias.grad() - ref->bias.grad()).abs().max().item<double>(), tol);
    EXPECT_LT((args.running_mean - ref->running_mean).abs().max().item<double>(), tol);
    EXPECT_LT((args.running_var - ref->running_var).abs().max().item<double>(), tol);
  }
}

TEST(BatchNormTest, OneValuePerChannelIsAnError) {
  fabric::nn::detail::SyncBatchNormArgs args;
  args.group = fabric::nn::detail::make_group(one_rank_group());
  try {
    fabric::nn::detail::sync_batch_norm(torch::randn({1, 3}), torch::ones({3}), torch::zeros({3}),
                                        args);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "sync_batch_norm: expected more than 1 value per channel in the global batch "
                 "when training, got 1 over 1 ranks");
  }
}

struct UserBlockImpl : torch::nn::Module {
  torch::nn::BatchNorm2d plain{register_module("plain", torch::nn::BatchNorm2d(2))};
  fabric::nn::BatchNorm2d ours{register_module("ours", fabric::nn::BatchNorm2d(2))};
  torch::nn::Sequential seq{
      register_module("seq", torch::nn::Sequential(torch::nn::Conv2d(2, 2, 1),
                                                   torch::nn::BatchNorm2d(2), torch::nn::ReLU()))};
  torch::nn::ModuleList list{
      register_module("list", torch::nn::ModuleList(torch::nn::BatchNorm1d(2)))};
  torch::nn::ModuleDict dict{register_module(
      "dict",
      torch::nn::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
          {"bn", torch::nn::BatchNorm3d(2).ptr()}}))};
};
TORCH_MODULE(UserBlock);

TEST(BatchNormTest, ConvertSwapsContainerMembersKeepingParametersAndReportsPlainMembers) {
  UserBlock block;
  const auto keys_before = keys(*block);
  const auto seq_weight = block->named_parameters()["seq.1.weight"];
  {
    torch::NoGradGuard no_grad;
    std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(block->seq->ptr(1))
        ->running_mean.fill_(7);
  }
  const auto report = fabric::nn::convert_sync_batchnorm(*block, one_rank_group());
  EXPECT_EQ(report.synchronized, (std::vector<std::string>{"ours", "seq.1", "list.0", "dict.bn"}));
  EXPECT_EQ(report.not_replaceable, std::vector<std::string>{"plain"});
  EXPECT_EQ(keys(*block), keys_before);
  EXPECT_TRUE(block->named_parameters()["seq.1.weight"].is_same(seq_weight));
  EXPECT_TRUE(block->seq->ptr(1)->as<fabric::nn::BatchNorm2dImpl>());
  EXPECT_EQ(block->named_buffers()["seq.1.running_mean"][0].item<float>(), 7);
  EXPECT_TRUE(block->list->ptr(0)->as<fabric::nn::BatchNorm1dImpl>());
  EXPECT_TRUE(block->dict["bn"]->as<fabric::nn::BatchNorm3dImpl>());
  // Sequential's forward runs the swapped module.
  EXPECT_EQ(block->seq->forward(torch::randn({3, 2, 4, 4})).sizes(),
            (std::vector<int64_t>{3, 2, 4, 4}));

  try {
    fabric::nn::convert_sync_batchnorm_or_throw(*block, one_rank_group());
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(),
                 "fabric.sync_batchnorm: cannot synchronize the torch::nn::BatchNorm at 'plain' (a "
                 "plain member of your module, so it cannot be swapped); declare it as "
                 "fabric::nn::BatchNorm1d/2d/3d (same options and state_dict keys, #include "
                 "\"fabric/nn/batch_norm.h\") or hold it in a torch::nn::Sequential");
  }
}

}  // namespace
