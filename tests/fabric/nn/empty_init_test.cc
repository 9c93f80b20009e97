// EmptyInit: a module built under it has no memory, and materialising it gives exactly the
// values (and leaves the generator where) a full construction with the same seed does.
#include "fabric/nn/empty_init.h"

#include <gtest/gtest.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "fabric/core/error.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3)));
    bn = register_module("bn", torch::nn::BatchNorm2d(8));
    emb = register_module("emb", torch::nn::Embedding(50, 16));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({16})));
    fc = register_module("fc", torch::nn::Linear(16, 10));
    // An init through a view, a random factory, and a constant from values.
    torch::NoGradGuard no_grad;
    fc->weight.narrow(0, 0, 4).normal_(0.0, 0.02);
    extra = register_parameter("extra", torch::randn({5, 7}) * 0.5);
    table = register_buffer("table", torch::tensor({1.0f, 2.0f, 3.0f}));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Embedding emb{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear fc{nullptr};
  torch::Tensor extra, table;
};
TORCH_MODULE(Net);

std::map<std::string, torch::Tensor> state(const torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().detach().clone();
  return out;
}

// A Net built under an empty init, and its record.
std::pair<Net, std::shared_ptr<fabric::InitRecord>> build_empty() {
  fabric::EmptyInit scope;
  Net net;
  return {net, scope.record()};
}

TEST(EmptyInit, BuildsWithoutMemoryAndMaterialisesTheFullInitValues) {
  torch::manual_seed(7);
  Net full;
  const auto expected = state(*full);
  const torch::Tensor next_full = torch::rand({4});

  torch::manual_seed(7);
  auto [empty, record] = build_empty();
  EXPECT_TRUE(fabric::has_meta_tensors(*empty));
  for (const auto& p : empty->parameters()) EXPECT_TRUE(p.is_meta());
  EXPECT_FALSE(empty->table.is_meta());  // torch::tensor's values are real: a constant
  EXPECT_GT(record->operations(), 10u);

  fabric::materialize(*empty, *record, torch::kCPU);
  EXPECT_FALSE(fabric::has_meta_tensors(*empty));
  const auto got = state(*empty);
  ASSERT_EQ(got.size(), expected.size());
  for (const auto& [name, t] : expected) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(torch::equal(got.at(name), t)) << name;
  }
  EXPECT_TRUE(empty->fc->weight.requires_grad());
  EXPECT_FALSE(empty->bn->running_mean.requires_grad());
  // The generator stands where the full construction left it.
  EXPECT_TRUE(torch::equal(torch::rand({4}), next_full));
  // And the module works (forward and backward).
  auto y = empty->fc(empty->norm(empty->emb(torch::tensor({1, 2, 3}))));
  y.sum().backward();
  EXPECT_TRUE(empty->fc->weight.grad().defined());
}

TEST(EmptyInit, ConversionsAfterTheScopeAreTheCallersAndPiecesComeOnce) {
  torch::manual_seed(3);
  Net full;
  full->to(torch::kBFloat16);
  torch::manual_seed(3);
  auto [empty, record] = build_empty();
  empty->to(torch::kBFloat16);  // a precision's conversion of the meta module
  std::map<std::string, int> seen;
  record->replay(*empty,
                 [&](const std::string& name, torch::Tensor& held, const torch::Tensor& value) {
                   ++seen[name];
                   EXPECT_NE(value.scalar_type(), torch::kBFloat16) << name;  // as recorded
                   if (value.is_floating_point()) {
                     EXPECT_EQ(held.scalar_type(), torch::kBFloat16) << name;
                   }
                   fabric::replace_data(held, value.to(held.scalar_type()));
                 });
  for (const auto& [name, n] : seen) EXPECT_EQ(n, 1) << name;
  EXPECT_EQ(seen.size(), 13u);  // every parameter and buffer but the constant table
  for (const auto& [name, t] : state(*full))
    EXPECT_TRUE(torch::equal(state(*empty).at(name), t)) << name;
}

TEST(EmptyInit, AForeignMetaTensorAndNestingAreErrors) {
  std::shared_ptr<fabric::InitRecord> record;
  torch::nn::Linear lin{nullptr};
  {
    fabric::EmptyInit scope;
    lin = torch::nn::Linear(4, 4);
    EXPECT_THROW(fabric::EmptyInit nested, fabric::Error);
    record = scope.record();
  }
  lin->register_parameter("foreign", torch::empty({4}, torch::kMeta));  // not the recording's
  try {
    fabric::materialize(*lin, *record, torch::kCPU);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'foreign' is on the meta device but the empty init did "
                                         "not make it"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
