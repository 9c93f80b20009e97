// Callbacks: Fabric::call reaches each hook, Fabric::save / load fire theirs, EarlyStopping's
// patience, modes and min_delta, its state through a checkpoint, and its one-line errors.
#include "fabric/callbacks.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/connector.h"
#include "fabric/fabric.h"

namespace {

fabric::Config config(const std::vector<std::string>& overrides = {}) {
  return fabric::Config::defaults(fabric::training_schema(), overrides);
}

const fabric::MachineFacts kCpu;  // one CPU process

struct Recorder : fabric::Callback {
  std::vector<std::string> seen;
  std::string name() const override { return "recorder"; }
  void on_fit_start(fabric::Fabric&) override { seen.push_back("fit_start"); }
  void on_train_batch_end(fabric::Fabric&, int64_t step, const fabric::Metrics&) override {
    seen.push_back("batch_end " + std::to_string(step));
  }
  void on_validation_end(fabric::Fabric&, int64_t step, const fabric::Metrics& m) override {
    seen.push_back("validation_end " + std::to_string(step) + " " + std::to_string(m.size()));
  }
  void on_save_checkpoint(fabric::Fabric&, const std::string& path) override {
    seen.push_back("save " + std::filesystem::path(path).filename().string());
  }
  void on_load_checkpoint(fabric::Fabric&, const std::string& path) override {
    seen.push_back("load " + std::filesystem::path(path).filename().string());
  }
  void on_event(fabric::Fabric&, const std::string& hook, int64_t step,
                const fabric::Metrics&) override {
    seen.push_back(hook + " " + std::to_string(step));
  }
};

TEST(CallbacksTest, FabricCallsEachHookAndFiresItsOwnEvents) {
  auto recorder = std::make_shared<Recorder>();
  fabric::Fabric f(config(), kCpu);
  f.add_callback(recorder);
  EXPECT_THROW(f.add_callback(std::make_shared<Recorder>()), fabric::Error);  // same name
  f.launch([&](fabric::Fabric& fab) {
    fab.call("on_fit_start");
    fab.call("on_train_batch_end", 1);
    fab.call("on_validation_end", 1, {{"val/loss", 2.0}});
    fab.call("on_my_event", 7);
    auto model = torch::nn::Linear(2, 2);
    fabric::CheckpointState state;
    state.add("model", model);
    const auto path = std::filesystem::path(::testing::TempDir()) / "callbacks.ckpt";
    fab.save(path.string(), state);
    fab.load(path.string(), state);
    EXPECT_FALSE(fab.should_stop());  // no callback asks
  });
  EXPECT_EQ(recorder->seen, (std::vector<std::string>{
                                "fit_start", "batch_end 1", "validation_end 1 1", "on_my_event 7",
                                "save callbacks.ckpt", "load callbacks.ckpt"}));
}

TEST(CallbacksTest, EarlyStoppingWaitsPatienceEvaluationsAndStopsEveryRank) {
  const auto callbacks = fabric::make_callbacks(config(
      {"callbacks.early_stopping.monitor=test/accuracy", "callbacks.early_stopping.patience=2"}));
  ASSERT_EQ(callbacks.size(), 1u);
  auto* early = dynamic_cast<fabric::EarlyStopping*>(callbacks[0].get());
  ASSERT_NE(early, nullptr);
  EXPECT_TRUE(early->maximize());  // auto: no "loss" in the name
  fabric::Fabric f(config(), kCpu);
  f.add_callback(callbacks[0]);
  std::vector<bool> stops;
  f.launch([&](fabric::Fabric& fab) {
    for (const double accuracy : {0.5, 0.6, 0.6, 0.59}) {
      fab.call("on_validation_end", static_cast<int64_t>(stops.size() + 1),
               {{"test/accuracy", accuracy}});
      stops.push_back(fab.should_stop());
    }
  });
  EXPECT_EQ(stops, (std::vector<bool>{false, false, false, true}));
  EXPECT_EQ(f.stop_reason(),
            "early stopping at step 4: test/accuracy did not rise by more than 0 in 2 "
            "evaluations (best 0.6 at step 2)");
  EXPECT_TRUE(fabric::make_callbacks(config()).empty());  // monitor "": off
}

TEST(CallbacksTest, EarlyStoppingModesMinDeltaAndResume) {
  fabric::Fabric f(config(), kCpu);
  fabric::EarlyStopping loss({"val/loss", "auto", 2, 0.1});
  EXPECT_FALSE(loss.maximize());
  loss.on_validation_end(f, 1, {{"val/loss", 3.0}});
  loss.on_validation_end(f, 2, {{"val/loss", 2.95}});  // not by more than 0.1
  EXPECT_EQ(loss.wait(), 1);
  EXPECT_EQ(*loss.best(), 3.0);

  // The state resumes: a fresh callback restored from it stops where this one would.
  fabric::EarlyStopping resumed({"val/loss", "auto", 2, 0.1});
  resumed.restore(loss.save_state());
  EXPECT_EQ(resumed.wait(), 1);
  EXPECT_EQ(resumed.best_step(), 1);
  resumed.on_validation_end(f, 3, {{"val/loss", std::nan("")}});  // non-finite: no improvement
  loss.on_validation_end(f, 3, {{"val/loss", 2.99}});
  EXPECT_EQ(resumed.stop_reason(),
            "early stopping at step 3: val/loss did not fall by more than 0.1 in 2 evaluations "
            "(best 3 at step 1)");
  EXPECT_EQ(loss.stop_reason(), resumed.stop_reason());

  // Another metric's state restores nothing.
  fabric::EarlyStopping other({"test/accuracy", "max", 2, 0.0});
  other.restore(loss.save_state());
  EXPECT_FALSE(other.best().has_value());

  try {
    other.on_validation_end(f, 1, {{"val/loss", 1.0}, {"epoch", 1.0}});
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "callbacks.early_stopping.monitor: no metric 'test/accuracy' at validation end "
              "(there: epoch, val/loss)");
  }
  EXPECT_THROW(fabric::EarlyStopping({"x", "up", 1, 0.0}), fabric::Error);
}

TEST(CallbacksTest, ModelSummaryAndLearningRateMonitor) {
  auto model =
      torch::nn::Sequential(torch::nn::Linear(4, 3), torch::nn::ReLU(), torch::nn::Linear(3, 2));
  model[2]->as<torch::nn::Linear>()->bias.set_requires_grad(false);
  torch::optim::SGD sgd(model->parameters(), 0.25);
  EXPECT_THROW(fabric::make_callbacks(config({"callbacks.lr_monitor=true"})),
               fabric::ConfigError);  // no optimizer given
  const auto callbacks =
      fabric::make_callbacks(config({"callbacks.model_summary=true", "callbacks.lr_monitor=true",
                                     "logging.log_every_n_steps=2"}),
                             model.get(), &sgd);
  ASSERT_EQ(callbacks.size(), 2u);
  const auto* summary = dynamic_cast<fabric::ModelSummary*>(callbacks[0].get());
  ASSERT_NE(summary, nullptr);
  EXPECT_EQ(
      summary->lines(),
      (std::vector<std::string>{
          "name  type               parameters  bytes", "0     torch::nn::Linear  15          60 B",
          "1     torch::nn::ReLU    0           0 B", "2     torch::nn::Linear  8           32 B",
          "total 23 parameters (21 trainable), 92 B"}));

  // The monitor logs each group's rate every 2nd step (read back from metrics.csv).
  const auto root = std::filesystem::path(::testing::TempDir()) / "lr_monitor";
  fabric::Fabric f(config({"logging.run_dir=" + root.string()}), kCpu);
  f.add_callback(callbacks[1]);
  f.launch([&](fabric::Fabric& fab) {
    fab.create_run_directory("lr");
    for (int64_t step = 1; step <= 4; ++step) fab.call("on_train_batch_end", step);
  });
  std::ifstream csv(root / "metrics.csv");
  std::stringstream text;
  text << csv.rdbuf();
  EXPECT_NE(text.str().find("lr/group_0"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("0.25"), std::string::npos) << text.str();
}

}  // namespace
