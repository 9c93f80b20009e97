#include "fabric/training/lr_scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace {

using fabric::LRSchedule;

TEST(LRScheduleTest, CosineWarmsUpThenDecaysToTheFloor) {
  auto s = LRSchedule::cosine(1.0, 110, 10, 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1.0);
  EXPECT_NEAR(s.lr_at(60), 0.55, 1e-12);  // halfway: floor + half the span
  EXPECT_DOUBLE_EQ(s.lr_at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.lr_at(1000), 0.1);  // clamped beyond the end
  for (int64_t t = 10; t < 110; ++t) EXPECT_GE(s.lr_at(t), s.lr_at(t + 1));
}

TEST(LRScheduleTest, LinearDecay) {
  auto s = LRSchedule::linear(2.0, 100, 0, 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 2.0);
  EXPECT_DOUBLE_EQ(s.lr_at(50), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(100), 0.0);
}

TEST(LRScheduleTest, OneCycleMatchesTorchOneCycleLR) {
  // Reference values printed by PyTorch 2.11:
  //   OneCycleLR(SGD(lr=1), max_lr=1.0, total_steps=100, cycle_momentum=False), lr before step t.
  auto s = LRSchedule::one_cycle(1.0, 100);
  const std::vector<std::pair<int64_t, double>> reference = {{0, 0.040000000000000036},
                                                             {10, 0.29516394846410077},
                                                             {29, 1.0},
                                                             {30, 0.9994965352845243},
                                                             {64, 0.500002},
                                                             {99, 4e-06}};
  for (auto [t, lr] : reference) EXPECT_NEAR(s.lr_at(t), lr, 1e-15) << "step " << t;
}

TEST(LRSchedulerTest, SetsEveryParamGroupPerStepAndResumes) {
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({a}, torch::optim::SGDOptions(5.0));
  sgd.add_param_group(
      torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(7.0)));
  fabric::LRScheduler sched(sgd, LRSchedule::linear(1.0, 4));
  for (auto& g : sgd.param_groups()) EXPECT_DOUBLE_EQ(g.options().get_lr(), 1.0);
  sched.step();
  sched.step();
  for (auto& g : sgd.param_groups()) EXPECT_DOUBLE_EQ(g.options().get_lr(), 0.5);
  fabric::LRScheduler resumed(sgd, LRSchedule::linear(1.0, 4));
  resumed.set_step(3);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[1].options().get_lr(), 0.25);
}

TEST(LRScheduleTest, FromConfigUsesTheSchedulerSection) {
  auto c = fabric::Config::defaults(
      fabric::training_schema(),
      {"optimizer.lr=0.4", "scheduler.name=cosine", "scheduler.warmup_steps=2"});
  auto s = LRSchedule::from_config(c, 10);
  EXPECT_EQ(s.name(), "cosine");
  EXPECT_DOUBLE_EQ(s.lr_at(0), 0.2);
  EXPECT_DOUBLE_EQ(s.lr_at(1), 0.4);
}

}  // namespace
