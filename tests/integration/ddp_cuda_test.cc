// GPU: DDP's CUDA paths. NCCL with world size 1 (16-mixed, GradScaler) trains exactly as
// single_device; two ranks sharing one GPU over Gloo equal one CPU process on the concatenated
// batches (ddp_parity_helper ... cuda_gloo).
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <filesystem>

#include "fabric/fabric.h"
#include "tests/cuda_skip.h"
#include "tests/run_command.h"

namespace {

std::vector<torch::Tensor> train(const std::string& strategy) {
  const auto config = fabric::Config::defaults(
      fabric::training_schema(), {"fabric.accelerator=cuda", "fabric.devices=1",
                                  "fabric.strategy=" + strategy, "fabric.precision=16-mixed"});
  std::vector<torch::Tensor> out;
  fabric::Fabric fabric(config);
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(0);
    torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                                torch::nn::Linear(32, 4));
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    f.setup(model, opt);
    for (int step = 0; step < 4; ++step) {
      torch::manual_seed(100 + step);
      auto x = f.to_device(torch::randn({8, 16}));
      auto y = f.to_device(torch::randn({8, 4}));
      opt.zero_grad();
      torch::Tensor loss;
      {
        auto guard = f.autocast();
        loss = torch::mse_loss(model->forward(x), y);
      }
      f.backward(loss);
      f.step(opt);
    }
    for (const auto& p : model->parameters()) out.push_back(p.detach().cpu());
  });
  return out;
}

TEST(DdpCudaTest, NcclWorldSizeOneTrainsLikeSingleDevice) {
  SKIP_WITHOUT_CUDA();
  const auto ddp = train("ddp");
  const auto single = train("single_device");
  ASSERT_EQ(ddp.size(), single.size());
  for (size_t i = 0; i < ddp.size(); ++i)
    EXPECT_LT((ddp[i] - single[i]).abs().max().item<double>(), 1e-6) << "parameter " << i;
}

TEST(DdpCudaTest, TwoRanksSharingOneGpuOverGlooEqualOneCpuProcess) {
  SKIP_WITHOUT_CUDA();
  const std::string exe = fabric::testing::helper_binary("//tests/integration:ddp_parity_helper");
  auto [code, out] = fabric::testing::run_command(exe + " 2 4 plain cuda_gloo");
  if (code == 77) GTEST_SKIP() << "the helper sees no GPU";
  EXPECT_EQ(code, 0) << out;
}

}  // namespace
