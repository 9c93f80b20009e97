#include "fabric/training/lr_scheduler.h"

#include <gtest/gtest.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "fabric/core/error.h"
#include "tests/run_command.h"

namespace {

namespace fs = std::filesystem;
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
  auto s = LRSchedule::from_config(config({"optimizer.lr=1", "scheduler.name=multistep",
                                           "scheduler.milestones=[3, 7]", "scheduler.gamma=0.5"}),
                                   10);
  EXPECT_EQ(s.name(), "multistep");
  EXPECT_DOUBLE_EQ(s.lr_at(2), 1.0);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 0.5);
  EXPECT_DOUBLE_EQ(s.lr_at(9), 0.25);
  auto p = LRSchedule::from_config(
      config({"optimizer.lr=1", "scheduler.name=reduce_on_plateau", "scheduler.warmup_steps=2"}),
      10);
  EXPECT_EQ(p.name(), "plateau");
  EXPECT_DOUBLE_EQ(p.lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(p.lr_at(5), 1.0);
  try {
    LRSchedule::from_config(config({"scheduler.name=plateau", "scheduler.gamma=2"}), 10);
    ADD_FAILURE() << "a plateau factor >= 1 was accepted";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(), "command line: scheduler.gamma: plateau: the factor must be < 1");
  }
  auto c = LRSchedule::from_config(config({"optimizer.lr=1", "scheduler.name=constant"}), 10);
  EXPECT_EQ(c.name(), "none");
  EXPECT_DOUBLE_EQ(c.lr_at(9), 1.0);
  // Bad milestones are config errors located like any other (exit 2 from run_main).
  for (const auto& [value, message] : std::vector<std::pair<std::string, std::string>>{
           {"[5, 3]",
            "command line: scheduler.milestones: 3 breaks the order: milestones are optimizer "
            "steps >= 0 in increasing order, e.g. [100, 200]"},
           {"[2.5]",
            "command line: scheduler.milestones: 2.5 is not a whole number of optimizer "
            "steps"}}) {
    try {
      LRSchedule::from_config(config({"scheduler.name=multistep", "scheduler.milestones=" + value}),
                              10);
      ADD_FAILURE() << value << " was accepted";
    } catch (const fabric::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), message);
    }
  }
}

TEST(LRSchedulerTest, GroupsKeepTheirRatiosPerStepAndAfterAResume) {
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  auto make = [&] {
    auto sgd = std::make_unique<torch::optim::SGD>(std::vector<torch::Tensor>{a},
                                                   torch::optim::SGDOptions(1.0));
    sgd->add_param_group(torch::optim::OptimizerParamGroup(
        {b}, std::make_unique<torch::optim::SGDOptions>(7.0)));  // 7x the schedule's base rate
    return sgd;
  };
  auto sgd = make();
  fabric::LRScheduler sched(*sgd, LRSchedule::linear(1.0, 4));
  EXPECT_DOUBLE_EQ(sgd->param_groups()[0].options().get_lr(), 1.0);
  EXPECT_DOUBLE_EQ(sgd->param_groups()[1].options().get_lr(), 7.0);
  sched.step();
  sched.step();
  EXPECT_DOUBLE_EQ(sgd->param_groups()[0].options().get_lr(), 0.5);
  EXPECT_DOUBLE_EQ(sgd->param_groups()[1].options().get_lr(), 3.5);
  EXPECT_DOUBLE_EQ(sched.get_lr(), 0.5);

  // A resumed process builds its optimizer with other rates: the saved ratios win.
  auto other = make();
  other->param_groups()[1].options().set_lr(0.1);
  fabric::LRScheduler resumed(*other, LRSchedule::linear(1.0, 4));
  auto state = sched.state();
  state.step = 3;
  resumed.load_state(state);
  EXPECT_DOUBLE_EQ(other->param_groups()[1].options().get_lr(), 0.25 * 7.0);

  // Another number of groups than the state's is refused, nothing changed.
  torch::optim::SGD single(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(1.0));
  fabric::LRScheduler third(single, LRSchedule::linear(1.0, 4));
  EXPECT_THROW(third.load_state(state), fabric::Error);
  EXPECT_EQ(third.current_step(), 0);
}

// ReduceLROnPlateau's decisions, both modes, with patience, cooldown, the relative threshold, a
// NaN and the min_lr floor, against PyTorch run on the same metrics (two groups: the second at 3x
// the rate, its floor 3x too, which is how our floor on the base rate scales).
TEST(LRSchedulerTest, PlateauMatchesTorchReduceLROnPlateau) {
  const std::vector<double> metrics = {0.5,  0.6,  0.6,  0.605, 0.59, 0.58, 0.7,  0.7,  0.69, NAN,
                                       0.69, 0.69, 0.71, 0.70,  0.70, 0.70, 0.70, 0.70, 0.70};
  for (const bool maximize : {true, false}) {
    std::string list;
    for (double m : metrics) list += (std::isnan(m) ? "float('nan')" : std::to_string(m)) + ",";
    const std::string program =
        "import torch\n"
        "a, b = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)\n"
        "opt = torch.optim.SGD([{'params': [a], 'lr': 0.1}, {'params': [b], 'lr': 0.3}])\n"
        "s = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode='" +
        std::string(maximize ? "max" : "min") +
        "', factor=0.5, patience=1, threshold=0.01, cooldown=1, min_lr=[0.01, 0.03])\n"
        "for m in [" +
        list +
        "]:\n"
        "    s.step(m)\n"
        "    print(repr(opt.param_groups[0]['lr']), repr(opt.param_groups[1]['lr']))\n";
    const fs::path script = fs::path(::testing::TempDir()) / "plateau.py";
    std::ofstream(script) << program;
    const auto r =
        fabric::testing::run_command(fabric::testing::python_interpreter() + " " + script.string());
    ASSERT_EQ(r.code, 0) << r.out;
    std::istringstream torch_lrs(r.out);

    auto a = torch::zeros({1}, torch::requires_grad());
    auto b = torch::zeros({1}, torch::requires_grad());
    torch::optim::SGD sgd(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(0.1));
    sgd.add_param_group(
        torch::optim::OptimizerParamGroup({b}, std::make_unique<torch::optim::SGDOptions>(0.3)));
    fabric::LRScheduler sched(sgd, LRSchedule::plateau(0.1, maximize, 0.5, /*patience=*/1,
                                                       /*threshold=*/0.01, /*cooldown=*/1,
                                                       /*min_lr=*/0.01));
    int reductions = 0;
    double last = 0.1;
    for (size_t i = 0; i < metrics.size(); ++i) {
      sched.report(metrics[i]);
      double want0 = 0, want1 = 0;
      ASSERT_TRUE(torch_lrs >> want0 >> want1) << r.out;
      EXPECT_NEAR(sgd.param_groups()[0].options().get_lr(), want0, 1e-15) << maximize << " " << i;
      EXPECT_NEAR(sgd.param_groups()[1].options().get_lr(), want1, 3e-15) << maximize << " " << i;
      reductions += want0 < last;
      last = want0;
    }
    EXPECT_GE(reductions, 2) << "the sequence must exercise reductions: " << r.out;
  }
}

TEST(LRSchedulerTest, PlateauStateResumesExactlyAndOtherSchedulesIgnoreReports) {
  auto a = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(1.0));
  const auto schedule = LRSchedule::plateau(1.0, /*maximize=*/false, 0.5, /*patience=*/2);
  fabric::LRScheduler whole(sgd, schedule);
  const std::vector<double> losses = {1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.96, 0.97};
  std::vector<double> lrs;
  fabric::LRScheduler::State middle;
  for (size_t i = 0; i < losses.size(); ++i) {
    whole.report(losses[i]);
    lrs.push_back(whole.get_lr());
    if (i == 3) middle = whole.state();
  }
  EXPECT_LT(lrs.back(), 1.0);
  torch::optim::SGD sgd2(std::vector<torch::Tensor>{a}, torch::optim::SGDOptions(1.0));
  fabric::LRScheduler resumed(sgd2, schedule);
  resumed.load_state(middle);
  for (size_t i = 4; i < losses.size(); ++i) {
    resumed.report(losses[i]);
    EXPECT_EQ(resumed.get_lr(), lrs[i]) << i;
  }
  fabric::LRScheduler cosine(sgd2, LRSchedule::cosine(1.0, 10));
  for (double loss : losses) cosine.report(loss);
  EXPECT_EQ(cosine.get_lr(), 1.0);
  EXPECT_THROW(LRSchedule::plateau(1.0, true, 1.5), fabric::Error);
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
