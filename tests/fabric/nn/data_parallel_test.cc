// fabric::nn::data_parallel (strategy dp's forward) on two CPU "devices": the same arithmetic as
// the module on its own, gradients that reach the module, BatchNorm running statistics that reach
// the module, and the caller's autocast state inside the replica threads.
#include "fabric/nn/data_parallel.h"

#include <gtest/gtest.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include "fabric/precision/autocast.h"

namespace {

const std::vector<torch::Device> kTwo = {torch::kCPU, torch::kCPU};

struct NetImpl : torch::nn::Cloneable<NetImpl> {
  explicit NetImpl(bool bn) : bn_(bn) { reset(); }
  void reset() override {
    fc1 = register_module("fc1", torch::nn::Linear(5, 8));
    if (bn_) norm = register_module("norm", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = fc1->forward(x);
    if (bn_) h = norm->forward(h);
    return fc2->forward(torch::relu(h));
  }
  bool bn_;
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(Net);

TEST(DataParallelTest, OutputsAndGradientsMatchTheModuleAlone) {
  torch::manual_seed(0);
  Net net(false);
  const torch::Tensor x = torch::randn({7, 5});  // 7 rows: chunks of 4 and 3
  const torch::Tensor out = fabric::nn::data_parallel(net, x, kTwo, torch::kCPU);
  out.pow(2).sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());

  net->zero_grad();
  const torch::Tensor ref = net->forward(x);
  ref.pow(2).sum().backward();
  EXPECT_TRUE(torch::allclose(out, ref, 1e-6, 1e-6));
  const auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::allclose(grads[i], params[i].grad(), 1e-5, 1e-6)) << "parameter " << i;
}

TEST(DataParallelTest, BatchNormRunningStatisticsReachTheModule) {
  torch::manual_seed(0);
  Net net(true);
  Net a = std::dynamic_pointer_cast<NetImpl>(net->clone());
  Net b = std::dynamic_pointer_cast<NetImpl>(net->clone());
  const torch::Tensor x = torch::randn({8, 5});
  fabric::nn::data_parallel(net, x, kTwo, torch::kCPU);
  a->forward(x.slice(0, 0, 4));  // what each replica saw
  b->forward(x.slice(0, 4, 8));
  const torch::Tensor mean = (a->norm->running_mean + b->norm->running_mean) / 2;
  const torch::Tensor var = (a->norm->running_var + b->norm->running_var) / 2;
  EXPECT_FALSE(torch::allclose(net->norm->running_mean, torch::zeros({8})));
  EXPECT_TRUE(torch::allclose(net->norm->running_mean, mean, 1e-6, 1e-7));
  EXPECT_TRUE(torch::allclose(net->norm->running_var, var, 1e-6, 1e-7));
  EXPECT_EQ(net->norm->num_batches_tracked.item<int64_t>(), 1);

  net->eval();  // evaluation leaves them alone
  const torch::Tensor before = net->norm->running_mean.clone();
  fabric::nn::data_parallel(net, torch::randn({8, 5}), kTwo, torch::kCPU);
  EXPECT_TRUE(torch::equal(net->norm->running_mean, before));
}

TEST(DataParallelTest, ReplicaThreadsRunUnderTheCallersAutocast) {
  Net net(false);
  const torch::Tensor x = torch::randn({6, 5});
  {
    fabric::AutocastGuard guard(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(fabric::nn::data_parallel(net, x, kTwo, torch::kCPU).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(fabric::nn::data_parallel(net, x, kTwo, torch::kCPU).scalar_type(), torch::kFloat32);
}

TEST(DataParallelTest, AReplicasErrorReachesTheCaller) {
  Net net(false);
  EXPECT_THROW(fabric::nn::data_parallel(net, torch::randn({4, 6}), kTwo, torch::kCPU), c10::Error);
}

}  // namespace
