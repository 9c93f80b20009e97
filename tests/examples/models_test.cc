// The example models are Cloneable (fabric.strategy: dp replicates them per GPU): a clone has the
// same structure and values in separate storage, and computes the same outputs.
#include "examples/common/models.h"

#include <gtest/gtest.h>
#include <torch/utils.h>

namespace {

template <typename Holder>
void expect_faithful_clone(Holder model, const torch::Tensor& input) {
  model->eval();
  auto copy = std::dynamic_pointer_cast<typename Holder::Impl>(model->clone());
  ASSERT_TRUE(copy);
  const auto mine = model->named_parameters(), theirs = copy->named_parameters();
  ASSERT_EQ(mine.keys(), theirs.keys());
  for (const auto& p : mine) {
    EXPECT_TRUE(torch::equal(p.value(), theirs[p.key()])) << p.key();
    EXPECT_NE(p.value().data_ptr(), theirs[p.key()].data_ptr()) << p.key();
  }
  EXPECT_TRUE(torch::allclose(model->forward(input), copy->forward(input)));
}

TEST(ModelsTest, ExampleModelsCloneFaithfully) {
  torch::manual_seed(0);
  expect_faithful_clone(examples::SmallCnn(4, 8), torch::randn({2, 1, 28, 28}));
  expect_faithful_clone(examples::ResNet18Cifar(4), torch::randn({2, 3, 32, 32}));
}

}  // namespace
