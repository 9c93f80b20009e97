// CUDA paths of the Core API (tag `gpu`; bazel test --config=gpu). Skips with a reason without a
// CUDA device. Covers: the loader's pinned side-stream copies, 16-mixed with the GradScaler on the
// GPU, bf16-mixed autocast dtypes, and the connector choosing cuda under auto.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fabric/fabric.h"

namespace {

bool has_cuda() {
#ifdef FABRIC_WITH_CUDA
  return torch::cuda::is_available();
#else
  return false;
#endif
}

#define SKIP_WITHOUT_CUDA()                                          \
  if (!has_cuda()) {                                                 \
    GTEST_SKIP() << "no CUDA device (or a --config=cpu_only build)"; \
  }                                                                  \
  static_assert(true)

fabric::Config config(std::vector<std::string> overrides) {
  return fabric::Config::defaults(fabric::training_schema(), overrides);
}

TEST(CudaFabricTest, LoaderDeliversPinnedCopiesOnTheDeviceInOrder) {
  SKIP_WITHOUT_CUDA();
  auto ids = torch::arange(1000, torch::kLong);
  auto ds = std::make_shared<fabric::TensorDataset>(ids.to(torch::kFloat).unsqueeze(1), ids);
  fabric::DataLoader loader(ds,
                            fabric::DataLoaderOptions().batch_size(64).num_workers(3).prefetch(4),
                            {1, 0, torch::Device(torch::kCUDA, 0)});
  int64_t expected = 0;
  for (fabric::Batch& b : loader) {
    ASSERT_TRUE(b.data.is_cuda());
    auto host = b.target.cpu();
    for (int64_t i = 0; i < host.size(0); ++i) EXPECT_EQ(host[i].item<int64_t>(), expected++);
    EXPECT_TRUE(torch::equal(b.data.squeeze(1).to(torch::kLong), b.target));
  }
  EXPECT_EQ(expected, 1000);
}

TEST(CudaFabricTest, AutoPicksCudaAndMixedPrecisionsTrain) {
  SKIP_WITHOUT_CUDA();
  for (const char* precision : {"16-mixed", "bf16-mixed", "32-true", "16-true"}) {
    fabric::Fabric fabric(config({std::string("fabric.precision=") + precision}));
    ASSERT_TRUE(fabric.device().is_cuda()) << precision;
    fabric.launch([&](fabric::Fabric& f) {
      torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                  torch::nn::Linear(32, 4));
      torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05));
      f.setup(model, opt);
      auto x = torch::randn({256, 16});
      auto y = torch::randint(0, 4, {256});
      auto loader = f.setup_dataloader(fabric::TensorDataset(x, y),
                                       fabric::DataLoaderOptions().batch_size(32));
      double first = -1, last = 0;
      for (int epoch = 0; epoch < 5; ++epoch) {
        for (fabric::Batch& b : loader) {
          opt.zero_grad();
          torch::Tensor logits;
          {
            auto guard = f.autocast();
            logits = model->forward(f.precision().convert_input(b.data));
          }
          if (std::string(precision) == "16-mixed") {
            EXPECT_EQ(logits.scalar_type(), torch::kHalf);
          } else if (std::string(precision) == "bf16-mixed") {
            EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
          }
          auto loss = torch::cross_entropy_loss(logits.to(torch::kFloat), b.target);
          f.backward(loss);
          f.step(opt);
          last = loss.item<double>();
          if (first < 0) first = last;
        }
      }
      EXPECT_LT(last, first) << precision;
      if (f.precision().scaler()) {
        EXPECT_EQ(f.precision().scaler()->get_scale(), 65536.0);
      }
    });
  }
}

TEST(CudaFabricTest, GradScalerSkipsInfStepsOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  fabric::GradScalerOptions o;
  o.init_scale = 8;
  fabric::GradScaler scaler(o);
  auto p = torch::ones({3}, torch::device(torch::kCUDA).requires_grad(true));
  torch::optim::SGD sgd({p}, torch::optim::SGDOptions(0.5));
  auto w = torch::tensor({1.0f, INFINITY, 2.0f}, torch::kCUDA);
  scaler.scale((p * w).sum()).backward();
  EXPECT_FALSE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 4.0);
  EXPECT_TRUE(torch::equal(p.detach().cpu(), torch::ones({3})));
}

}  // namespace
