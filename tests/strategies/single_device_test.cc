// strategies::SingleDevice on its own: one process, collectives are the identity, the module is
// placed and converted for the precision, gradient sync cannot be skipped because there is none.
#include "strategies/single_device.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>

#include "fabric/core/error.h"

namespace {

using fabric::PrecisionMode;
using fabric::ReduceOp;

std::unique_ptr<fabric::Precision> precision(PrecisionMode mode) {
  return std::make_unique<fabric::Precision>(mode, c10::DeviceType::CPU);
}

TEST(SingleDeviceTest, DescribesAOneProcessJob) {
  fabric::strategies::SingleDevice s(torch::kCPU, precision(PrecisionMode::k32True));
  EXPECT_EQ(s.name(), "single_device");
  EXPECT_EQ(s.root_device(), torch::Device(torch::kCPU));
  EXPECT_EQ(s.world_size(), 1);
  EXPECT_EQ(s.global_rank(), 0);
  EXPECT_EQ(s.replica_devices(), nullptr);
}

TEST(SingleDeviceTest, CollectivesAreTheIdentityAndNameAMissingSource) {
  fabric::strategies::SingleDevice s(torch::kCPU, precision(PrecisionMode::k32True));
  s.setup_environment();
  const auto t = torch::tensor({1.5, -2.0});
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin})
    EXPECT_TRUE(torch::equal(s.all_reduce(t, op), t));
  EXPECT_TRUE(torch::equal(s.broadcast(t, 0), t));
  auto gathered = s.all_gather(t);
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_TRUE(torch::equal(gathered[0], t));
  try {
    s.broadcast(t, 1);
    FAIL() << "broadcast from rank 1 of 1";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(), "broadcast: src 1 does not exist (world size 1)");
  }
  s.teardown();
}

TEST(SingleDeviceTest, SetupModuleConvertsForATruePrecisionKeepingParameterIdentity) {
  fabric::strategies::SingleDevice s(torch::kCPU, precision(PrecisionMode::kBf16True));
  torch::nn::Linear model(3, 2);
  const void* weight_before = model->weight.unsafeGetTensorImpl();
  s.setup_module(*model);
  EXPECT_EQ(model->weight.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(model->bias.scalar_type(), torch::kBFloat16);
  // Optimizers built before setup keep working: the parameters are the same tensors.
  EXPECT_EQ(model->weight.unsafeGetTensorImpl(), weight_before);
}

TEST(SingleDeviceTest, BackwardAndStepGoThroughThePrecision) {
  fabric::strategies::SingleDevice s(torch::kCPU, precision(PrecisionMode::k32True));
  torch::nn::Linear model(2, 1);
  s.setup_module(*model);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
  const auto before = model->weight.detach().clone();
  auto loss = model->forward(torch::ones({4, 2})).sum();
  {
    auto guard = s.no_backward_sync();  // nothing to skip with one process
    s.backward(loss);
  }
  ASSERT_TRUE(model->weight.grad().defined());
  EXPECT_TRUE(torch::allclose(model->weight.grad(), torch::full({1, 2}, 4.0)));
  EXPECT_TRUE(s.optimizer_step(sgd));
  EXPECT_TRUE(torch::allclose(model->weight.detach(), before - 2.0));
}

}  // namespace
