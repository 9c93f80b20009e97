// Stateful objects in checkpoints: a file written before CheckpointState held Stateful objects
// (testdata/format1.ckpt) still loads into today's loader, scheduler, scaler and values, and a
// user's own Stateful object round-trips and is checked like the built-in ones.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "fabric/checkpoint/archive.h"
#include "fabric/core/stateful.h"
#include "fabric/fabric.h"
#include "fabric/training/lr_scheduler.h"
#include "tests/fabric/checkpoint/checkpoint_testing.h"

namespace fs = std::filesystem;
using fabric::Error;

namespace {

using namespace fabric::checkpoint_testing;

// The objects of FileOfFormatOneStillLoads, as they stood when the fixture was written.
struct FormatOneObjects {
  torch::nn::Sequential model = make_model();
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
  fabric::LRScheduler scheduler{optimizer, fabric::LRSchedule::cosine(0.1, 10)};
  fabric::GradScaler scaler;
  fabric::DataLoader loader{
      std::make_shared<fabric::TensorDataset>(torch::arange(30).view({30, 1}), torch::arange(30)),
      fabric::DataLoaderOptions().batch_size(4).shuffle(true).seed(7)};
  int64_t count = 0;
  double ratio = 0;
  bool flag = false;
  std::string note;
  torch::Tensor best;
  fabric::CheckpointState state() {
    fabric::CheckpointState s;
    s.add("model", model).add("optimizer", optimizer).add("scheduler", scheduler);
    s.add("scaler", scaler).add("train_loader", loader);
    s.add("count", count).add("ratio", ratio).add("flag", flag).add("note", note).add("best", best);
    return s;
  }
};

// A checkpoint written by the build of 2026-11-26 (before CheckpointState held Stateful objects)
// loads into today's objects: every entry's values come back. FABRIC_WRITE_FORMAT_ONE=PATH writes
// the fixture instead (it was written once, by that build).
TEST_F(CheckpointTest, FileOfFormatOneStillLoads) {
  fabric::Fabric f(config(), kCpu);
  if (const char* out = std::getenv("FABRIC_WRITE_FORMAT_ONE")) {
    torch::manual_seed(0);
    FormatOneObjects o;
    train(o.model, o.optimizer, 2, 1);
    o.scheduler.step();
    o.scheduler.step();
    o.scaler.load_state_dict({{"scale", 1024.0},
                              {"growth_factor", 2.0},
                              {"backoff_factor", 0.5},
                              {"growth_interval", 2000.0},
                              {"growth_tracker", 3.0}});
    int taken = 0;
    for (auto& batch : o.loader) {
      (void)batch;
      if (++taken == 3) break;
    }
    o.count = 5;
    o.ratio = 0.25;
    o.flag = true;
    o.note = "hello";
    o.best = torch::tensor({0.5, 1.5});
    f.save(out, o.state());
    GTEST_SKIP() << "wrote " << out << " (nothing was tested)";
  }
  const fs::path file = "tests/fabric/checkpoint/testdata/format1.ckpt";
  const c10::impl::GenericDict saved =
      fabric::load_archive(file).toGenericDict().at("state").toGenericDict();
  torch::manual_seed(1);  // other initial weights than the file's
  FormatOneObjects o;
  fabric::CheckpointState state = o.state();
  f.load(file.string(), state);
  const auto model = saved.at("model").toGenericDict();
  for (const auto& p : o.model->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), model.at(p.key()).toTensor())) << p.key();
  const auto buffers = saved.at("optimizer").toGenericDict().at("state").toGenericDict();
  ASSERT_EQ(buffers.size(), 4u);  // a momentum buffer per parameter
  const auto params = o.model->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& live = static_cast<const torch::optim::SGDParamState&>(
        *o.optimizer.state().at(params[i].unsafeGetTensorImpl()));
    const auto file_buffer = buffers.at(static_cast<int64_t>(i)).toGenericDict();
    EXPECT_TRUE(torch::equal(live.momentum_buffer(), file_buffer.at("momentum_buffer").toTensor()))
        << "parameter " << i;
  }
  EXPECT_EQ(o.scheduler.current_step(), 2);
  EXPECT_DOUBLE_EQ(o.optimizer.param_groups()[0].options().get_lr(),
                   fabric::LRSchedule::cosine(0.1, 10).lr_at(2));
  EXPECT_EQ(o.scaler.state_dict(), (std::map<std::string, double>{{"scale", 1024.0},
                                                                  {"growth_factor", 2.0},
                                                                  {"backoff_factor", 0.5},
                                                                  {"growth_interval", 2000.0},
                                                                  {"growth_tracker", 3.0}}));
  EXPECT_EQ(o.loader.state().epoch, 0);
  EXPECT_EQ(o.loader.state().batches, 3);
  EXPECT_EQ(o.count, 5);
  EXPECT_EQ(o.ratio, 0.25);
  EXPECT_TRUE(o.flag);
  EXPECT_EQ(o.note, "hello");
  EXPECT_TRUE(torch::equal(o.best, torch::tensor({0.5, 1.5})));
}

// An object of the user's: a running sum and how many values went into it.
class RunningSum : public fabric::Stateful {
 public:
  void add(double x) {
    sum_ += torch::tensor({x}, torch::kFloat64);
    ++count_;
  }
  double mean() const { return sum_.item<double>() / static_cast<double>(count_); }
  int64_t count() const { return count_; }
  c10::IValue save_state() const override {
    auto d = fabric::new_state_dict();
    d.insert("sum", sum_);
    d.insert("count", count_);
    return d;
  }
  std::function<void()> prepare_restore(const c10::IValue& saved,
                                        const std::string& source) override {
    const int64_t count = fabric::state_int(saved, "count", source);
    const c10::IValue sum = fabric::state_field(saved, "sum", source);
    if (!sum.isTensor()) throw Error(fabric::state_type_error(source, "a tensor (\"sum\")", sum));
    return [this, count, sum = sum.toTensor()] {
      count_ = count;
      sum_ = sum.clone();
    };
  }

 private:
  torch::Tensor sum_ = torch::zeros({1}, torch::kFloat64);
  int64_t count_ = 0;
};

// A Stateful object of the user's is saved and restored like the built-in ones; a state that does
// not fit is named in one line and changes nothing (neither it nor the other entries).
TEST_F(CheckpointTest, UserStatefulObjectsRoundTripAndAreChecked) {
  fabric::Fabric f(config(), kCpu);
  RunningSum running;
  for (double x : {1.0, 2.0, 6.0}) running.add(x);
  int64_t step = 7;
  fabric::CheckpointState state;
  state.add("running", running).add("step", step);
  const fs::path file = dir_ / "user.ckpt";
  f.save(file.string(), state);

  RunningSum fresh;
  int64_t fresh_step = 0;
  fabric::CheckpointState state2;
  state2.add("running", fresh).add("step", fresh_step);
  f.load(file.string(), state2);
  EXPECT_EQ(fresh.count(), 3);
  EXPECT_DOUBLE_EQ(fresh.mean(), 3.0);
  EXPECT_EQ(fresh_step, 7);

  // The name bound to a plain value instead: refused in one line, nothing applied.
  int64_t not_a_sum = -1;
  RunningSum other;
  fabric::CheckpointState wrong;
  int64_t running_as_int = -1;
  wrong.add("running", running_as_int).add("step", not_a_sum);
  EXPECT_EQ(error_of([&] { f.load(file.string(), wrong); }),
            file.string() + ": running: holds a GenericDict, expected an integer");
  EXPECT_EQ(not_a_sum, -1);
  // A state missing a key: the key is named.
  c10::impl::GenericDict broken = fabric::new_state_dict();
  broken.insert("sum", torch::zeros({1}, torch::kFloat64));
  EXPECT_EQ(error_of([&] { other.restore(broken, "running"); }),
            "running: malformed (no \"count\")");
  EXPECT_EQ(other.count(), 0);
}

}  // namespace
