#include "fabric/training/lr_scheduler.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fabric/core/error.h"

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

TEST(LRScheduleTest, StepAndMultiStepMatchTorch) {
  // Reference values printed by PyTorch 2.11: SGD(lr=0.8) with StepLR(step_size=3, gamma=0.5)
  // and MultiStepLR(milestones=[2, 5, 6], gamma=0.1), lr before step t.
  const std::vector<double> step_lr = {0.8, 0.8, 0.8, 0.4, 0.4, 0.4, 0.2, 0.2, 0.2, 0.1};
  const std::vector<double> multi_lr = {0.8,
                                        0.8,
                                        0.08000000000000002,
                                        0.08000000000000002,
                                        0.08000000000000002,
                                        0.008000000000000002,
                                        0.0008000000000000003,
                                        0.0008000000000000003,
                                        0.0008000000000000003,
                                        0.0008000000000000003};
  auto step = LRSchedule::step(0.8, 3, 0.5);
  auto multi = LRSchedule::multistep(0.8, {2, 5, 6}, 0.1);
  for (int64_t t = 0; t < 10; ++t) {
    EXPECT_NEAR(step.lr_at(t), step_lr[t], 1e-15 * step_lr[t]) << "step " << t;
    EXPECT_NEAR(multi.lr_at(t), multi_lr[t], 1e-15 * multi_lr[t]) << "step " << t;
  }
  // A warm-up ramps to the rate the schedule has at that step.
  auto warm = LRSchedule::step(0.8, 3, 0.5, 4);
  EXPECT_DOUBLE_EQ(warm.lr_at(0), 0.8 / 4);
  EXPECT_DOUBLE_EQ(warm.lr_at(3), 0.4);
  EXPECT_DOUBLE_EQ(warm.lr_at(4), 0.4);
}

TEST(LRScheduleTest, StepSchedulesFromConfigAndTheirErrors) {
  auto config = [](std::vector<std::string> keys) {
    return fabric::Config::defaults(fabric::training_schema(), keys);
  };
  auto s = LRSchedule::from_config(
      config({"optimizer.lr=1", "scheduler.name=multistep", "scheduler.milestones=[3, 7]",
              "scheduler.gamma=0.5"}),
      10);
  EXPECT_EQ(s.name(), "multistep");
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.25);
  auto c = LRSchedule::from_config(config({"optimizer.lr=1", "scheduler.name=constant"}), 10);
  EXPECT_EQ(c.name(), "none");
  EXPECT_DOUBLE_EQ(c.lr_at(9), 1.0);
  EXPECT_THROW(LRSchedule::from_config(config({"scheduler.name=multistep",
                                               "scheduler.milestones=[5, 3]"}),
                                       10),
               fabric::Error);
  try {
    LRSchedule::from_config(
        config({"scheduler.name=multistep", "scheduler.milestones=[2.5]"}), 10);
    ADD_FAILURE() << "a fractional milestone was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scheduler.milestones: 2.5"), std::string::npos)
        << e.what();
  }
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
