// CUDA paths of the Core API (tag `gpu`; bazel test --config=gpu). Skips with a reason without a
// CUDA device. Covers: the loader's pinned side-stream copies, 16-mixed with the GradScaler on the
// GPU, bf16-mixed autocast dtypes, the connector choosing cuda under auto, and checkpoints of CUDA
// state (generator, optimizer buffers, GradScaler) continuing exactly.
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include "fabric/fabric.h"
#include "tests/cuda_skip.h"

namespace {

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
  o.init_scale(8);
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

// 16-mixed on the GPU: 3 steps, save, 3 more; a second model loads the checkpoint and repeats the
// last 3 steps: bitwise the same parameters (CUDA generator for dropout, Adam buffers on the
// device, GradScaler scale and growth tracker all restored).
TEST(CudaFabricTest, CheckpointOfCudaStateContinuesExactly) {
  SKIP_WITHOUT_CUDA();
  fabric::Fabric f(config({"fabric.precision=16-mixed", "fabric.accelerator=cuda"}));
  auto make = [] {
    return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::Dropout(0.2),
                                 torch::nn::ReLU(), torch::nn::Linear(32, 4));
  };
  auto run = [&](torch::nn::Sequential& model, torch::optim::Adam& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      opt.zero_grad();
      auto x = torch::randn({8, 16}, torch::Device(torch::kCUDA, 0));  // CUDA generator
      torch::Tensor loss;
      {
        auto guard = f.autocast();
        loss = model->forward(x).square().mean();
      }
      f.backward(loss);
      f.step(opt);
    }
  };
  auto a = make();
  torch::optim::Adam opt_a(a->parameters(), torch::optim::AdamOptions(1e-2));
  f.setup(a, opt_a);
  run(a, opt_a, 3);
  fabric::CheckpointState state_a;
  state_a.add("model", a).add("optimizer", opt_a);
  const std::string file = ::testing::TempDir() + "/cuda.ckpt";
  f.save(file, state_a);
  run(a, opt_a, 3);

  auto b = make();
  torch::optim::Adam opt_b(b->parameters(), torch::optim::AdamOptions(1e-2));
  f.setup(b, opt_b);
  fabric::CheckpointState state_b;
  state_b.add("model", b).add("optimizer", opt_b);
  f.load(file, state_b);
  for (const auto& p : b->parameters()) ASSERT_TRUE(p.is_cuda());
  run(b, opt_b, 3);
  const auto pa = a->parameters(), pb = b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << i;
}

}  // namespace
