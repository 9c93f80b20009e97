// LibTorch's own datasets as fabric::Datasets (fabric/data/torch_dataset.h): per-example get(),
// Stack-ed batches read by several threads, MNIST-like stacks and datasets without targets batch
// like the same TensorDataset.
#include "fabric/data/torch_dataset.h"

#include <gtest/gtest.h>
#include <torch/data.h>

#include <optional>
#include <vector>

#include "fabric/data/data_loader.h"

namespace {

using fabric::Batch;
using fabric::DataLoader;
using fabric::DataLoaderOptions;

// Example i has data [i, i] and target i, so batches reveal which examples they hold.
std::shared_ptr<fabric::TensorDataset> numbered(int64_t n) {
  auto ids = torch::arange(n, torch::kLong);
  return std::make_shared<fabric::TensorDataset>(ids.to(torch::kFloat).unsqueeze(1).repeat({1, 2}),
                                                 ids);
}

std::vector<int64_t> targets_of(DataLoader& loader, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<int64_t> out;
  for (Batch& b : loader) {
    EXPECT_TRUE(torch::equal(b.data.select(1, 0).to(torch::kLong), b.target));
    if (batch_sizes) batch_sizes->push_back(b.target.size(0));
    for (int64_t i = 0; i < b.target.size(0); ++i) out.push_back(b.target[i].item<int64_t>());
  }
  return out;
}

// LibTorch's own datasets (fabric/data/torch_dataset.h): example i is {[i, i], i}.
struct TorchNumbered : torch::data::datasets::Dataset<TorchNumbered> {
  explicit TorchNumbered(int64_t n) : n(n) {}
  torch::data::Example<> get(size_t i) override {
    const auto x = static_cast<float>(i);
    return {torch::tensor({x, x}), torch::tensor(static_cast<int64_t>(i))};
  }
  std::optional<size_t> size() const override { return static_cast<size_t>(n); }
  int64_t n;
};

// The same stack as numbered(n), offered MNIST's way (images(), targets()).
struct TorchStacked : TorchNumbered {
  using TorchNumbered::TorchNumbered;
  torch::Tensor images() const { return numbered(n)->data(); }
  torch::Tensor targets() const { return numbered(n)->target(); }
};

TEST(TorchDatasetTest, BatchesLikeTheSameTensorDataset) {
  const auto options = [] { return DataLoaderOptions().batch_size(4).shuffle(true).seed(5); };
  DataLoader reference(numbered(30), options());
  const auto expected = targets_of(reference);
  // Per-example get() stacked here, stacked by torch's Stack transform, read by 3 threads (each
  // with its own copy of the dataset), and MNIST-like stacks read as a TensorDataset.
  DataLoader unstacked(fabric::from_torch(TorchNumbered(30)), options());
  EXPECT_EQ(targets_of(unstacked), expected);
  DataLoader stacked(fabric::from_torch(TorchNumbered(30).map(torch::data::transforms::Stack<>())),
                     options().num_workers(3));
  EXPECT_EQ(targets_of(stacked), expected);
  const auto stack = fabric::from_torch(TorchStacked(30));
  EXPECT_NE(dynamic_cast<const fabric::TensorDataset*>(stack.get()), nullptr);
  DataLoader fast(stack, options());
  EXPECT_EQ(targets_of(fast), expected);
  // A dataset without targets (torch::data::datasets::TensorDataset): Batch::target undefined.
  DataLoader untargeted(fabric::from_torch(torch::data::datasets::TensorDataset(
                            torch::arange(10, torch::kFloat).unsqueeze(1))),
                        DataLoaderOptions().batch_size(4));
  std::vector<float> seen;
  for (Batch& b : untargeted) {
    EXPECT_FALSE(b.target.defined());
    EXPECT_EQ(b.size(), b.data.size(0));
    for (int64_t i = 0; i < b.data.size(0); ++i) seen.push_back(b.data[i][0].item<float>());
  }
  EXPECT_EQ(seen, (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

}  // namespace
