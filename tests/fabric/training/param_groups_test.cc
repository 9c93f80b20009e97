// Parameter groups from rules (fabric/training/param_groups.h) and make_optimizer's groups from
// optimizer.no_weight_decay / optimizer.lr_scale: which parameter lands in which group, each
// group's options, and the one-line errors for selectors that match nothing and malformed entries.
// The training parity of the groups on every strategy is tests/integration/param_groups_test.
#include "fabric/training/param_groups.h"

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/training/optimizers.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 6));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    head = register_module("head", torch::nn::Sequential(torch::nn::Linear(6, 2)));
  }
  torch::nn::Linear fc1{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Sequential head{nullptr};
};
TORCH_MODULE(Net);

std::vector<std::string> names(const fabric::ParamGroup& g) { return g.names; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ParamGroupsTest, RulesPartitionTheParametersInModuleOrder) {
  Net net;
  fabric::ParamGroupRules rules;
  rules.no_weight_decay = {"*.bias", "type:LayerNorm"};
  rules.lr_scale = {{"head.*", 10.0}, {"*.bias", 0.5}};  // head.0.bias: the first rule decides
  const auto groups = fabric::group_parameters(*net, rules);
  ASSERT_EQ(groups.size(), 5u);
  using V = std::vector<std::string>;
  EXPECT_EQ(names(groups[0]), V({"fc1.weight"}));
  EXPECT_EQ(names(groups[1]), V({"fc1.bias", "norm.bias"}));
  EXPECT_EQ(names(groups[2]), V({"norm.weight"}));
  EXPECT_EQ(names(groups[3]), V({"head.0.weight"}));
  EXPECT_EQ(names(groups[4]), V({"head.0.bias"}));
  const std::vector<std::pair<double, bool>> options = {
      {1.0, true}, {0.5, false}, {1.0, false}, {10.0, true}, {10.0, false}};
  for (size_t g = 0; g < groups.size(); ++g) {
    EXPECT_EQ(groups[g].lr_scale, options[g].first) << g;
    EXPECT_EQ(groups[g].weight_decay, options[g].second) << g;
  }
  // The tensors are the module's own (each once).
  EXPECT_TRUE(groups[0].params[0].is_same(net->fc1->weight));
  size_t total = 0;
  for (const auto& g : groups) total += g.params.size();
  EXPECT_EQ(total, net->parameters().size());
}

TEST(ParamGroupsTest, WithoutRulesOneGroupAndEveryUnmatchedSelectorIsAnError) {
  Net net;
  const auto one = fabric::group_parameters(*net, {});
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].params.size(), net->parameters().size());

  fabric::ParamGroupRules typo;
  typo.no_weight_decay = {"*.bais"};
  EXPECT_EQ(error_of([&] { fabric::group_parameters(*net, typo); }),
            "'*.bais' matches no parameter of Net (parameter names look like 'fc1.weight', "
            "'fc1.bias', 'norm.weight'; module types are written like type:Linear)");
  // A rule that never wins (an earlier one takes all its parameters) still counts as matching.
  fabric::ParamGroupRules shadowed;
  shadowed.lr_scale = {{"*", 2.0}, {"head.*", 3.0}};
  EXPECT_EQ(fabric::group_parameters(*net, shadowed).size(), 1u);
}

TEST(ParamGroupsTest, SelectorsAndScaleEntries) {
  EXPECT_TRUE(fabric::selector_matches("layer?.*", "layer1.0.conv1.weight", "Conv2d"));
  EXPECT_TRUE(fabric::selector_matches("type:*Norm*", "x", "fabric::nn::SyncBatchNormImpl"));
  EXPECT_TRUE(fabric::selector_matches("type:BatchNorm2d", "x", "torch::nn::BatchNorm2dImpl"));
  EXPECT_FALSE(fabric::selector_matches("type:Linear", "x", "torch::nn::LayerNormImpl"));
  EXPECT_FALSE(fabric::selector_matches("fc.*", "head.fc.weight", "Linear"));
  EXPECT_EQ(fabric::parse_lr_scale("head.*=10"), std::make_pair(std::string("head.*"), 10.0));
  EXPECT_EQ(error_of([] { fabric::parse_lr_scale("head.*"); }),
            "'head.*': write SELECTOR=FACTOR, e.g. \"fc.*=10\"");
  EXPECT_EQ(error_of([] { fabric::parse_lr_scale("head.*=-1"); }),
            "'head.*=-1': the factor '-1' is not a number > 0; write SELECTOR=FACTOR, e.g. "
            "\"fc.*=10\"");
  EXPECT_NE(error_of([] { fabric::parse_lr_scale("=2"); }), "(no error)");
}

fabric::Config config(const std::vector<std::string>& overrides) {
  return fabric::Config::defaults(fabric::training_schema(), overrides);
}

TEST(ParamGroupsTest, MakeOptimizerGivesEachGroupItsRateAndDecay) {
  Net net;
  auto optimizer = fabric::make_optimizer(
      config({"optimizer.name=adamw", "optimizer.lr=0.01", "optimizer.weight_decay=0.05",
              "optimizer.no_weight_decay=[\"*.bias\", \"type:LayerNorm\"]",
              "optimizer.lr_scale=[\"head.*=10\"]"}),
      *net);
  auto& groups = optimizer->param_groups();
  ASSERT_EQ(groups.size(), 4u);  // fc1.weight | fc1.bias, norm.* | head.0.weight | head.0.bias
  const std::vector<std::pair<double, double>> expected = {
      {0.01, 0.05}, {0.01, 0.0}, {0.1, 0.05}, {0.1, 0.0}};
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(groups[g].options());
    EXPECT_DOUBLE_EQ(o.lr(), expected[g].first) << g;
    EXPECT_DOUBLE_EQ(o.weight_decay(), expected[g].second) << g;
    EXPECT_DOUBLE_EQ(std::get<0>(o.betas()), 0.9) << g;  // the other options are the config's
  }
  EXPECT_EQ(groups[1].params().size(), 3u);
  EXPECT_NE(dynamic_cast<fabric::AdamW*>(optimizer.get()), nullptr);
  // No rules: one group, as before.
  EXPECT_EQ(fabric::make_optimizer(config({}), *net)->param_groups().size(), 1u);
}

TEST(ParamGroupsTest, MakeOptimizerErrorsNameTheKey) {
  Net net;
  EXPECT_EQ(
      error_of([&] { fabric::make_optimizer(config({"optimizer.lr_scale=[\"fc2.*=2\"]"}), *net); }),
      "command line: optimizer.lr_scale: 'fc2.*' matches no parameter of Net (parameter "
      "names look like 'fc1.weight', 'fc1.bias', 'norm.weight'; module types are written "
      "like type:Linear)");
  EXPECT_EQ(
      error_of([&] { fabric::make_optimizer(config({"optimizer.lr_scale=[\"fc1.*:2\"]"}), *net); }),
      "command line: optimizer.lr_scale: 'fc1.*:2': write SELECTOR=FACTOR, e.g. \"fc.*=10\"");
  EXPECT_EQ(error_of([&] {
              fabric::make_optimizer(config({"optimizer.no_weight_decay=[\"*.bias\"]"}),
                                     net->parameters());
            }),
            "command line: optimizer.no_weight_decay: needs the parameters' names: build the "
            "optimizer with fabric::make_optimizer(config, *model) instead of model->parameters()");
  // The config rejects a repeated or empty selector and a scalar where a list belongs.
  EXPECT_NE(error_of([] {
              config({"optimizer.no_weight_decay=[a, a]"});
            }).find("optimizer.no_weight_decay: 'a' is listed twice"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              config({"optimizer.no_weight_decay=\"*.bias\""});
            }).find("is not a list: write it like ['*.bias']"),
            std::string::npos);
}

}  // namespace
