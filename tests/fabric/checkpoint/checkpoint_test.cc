// Checkpoint pieces in one process (optimizer state: optimizer_state_test.cc): DataLoader
// mid-epoch resume, Fabric::save/load strictness and one-line errors for bad input (nothing
// changed, nothing overwritten), config differences, and Python's torch.load(weights_only=True)
// reading a checkpoint.
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <filesystem>
#include <fstream>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/connector.h"
#include "fabric/fabric.h"
#include "fabric/training/fast_optimizers.h"
#include "fabric/training/lr_scheduler.h"
#include "tests/fabric/checkpoint/checkpoint_testing.h"
#include "tests/run_command.h"

namespace fs = std::filesystem;

namespace {

using namespace fabric::checkpoint_testing;

TEST_F(CheckpointTest, DataLoaderResumesInTheMiddleOfAnEpoch) {
  auto data =
      std::make_shared<fabric::TensorDataset>(torch::arange(30).view({30, 1}), torch::arange(30));
  auto options = fabric::DataLoaderOptions().batch_size(4).shuffle(true).num_workers(2).seed(7);
  options.transform([](fabric::Batch b, at::Generator& gen) {
    b.data = b.data + torch::randint(0, 1000, b.data.sizes(), gen);  // augmentation randomness
    return b;
  });
  fabric::DataLoader reference(data, options);
  std::vector<torch::Tensor> expected;
  for (int epoch = 0; epoch < 3; ++epoch)
    for (auto& batch : reference) expected.push_back(batch.data.clone());

  fabric::DataLoader first(data, options);
  for (auto& batch : first) (void)batch;  // epoch 0
  fabric::DataLoader::State saved;
  int taken = 0;
  for (auto& batch : first) {  // epoch 1: 3 of 8 batches
    (void)batch;
    if (++taken == 3) {
      saved = first.state();
      break;
    }
  }
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.batches, 3);
  fabric::DataLoader second(data, options);
  second.load_state(saved);
  EXPECT_EQ(second.next_epoch(), 1);
  std::vector<torch::Tensor> rest;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (auto& batch : second) rest.push_back(batch.data.clone());
  ASSERT_EQ(rest.size(), expected.size() - 8 - 3);
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_TRUE(torch::equal(rest[i], expected[8 + 3 + i])) << "batch " << i;
  // The last batch of an epoch resumes with the next epoch.
  fabric::DataLoader third(data, options);
  third.load_state({1, 8});
  EXPECT_EQ(third.next_epoch(), 2);
  EXPECT_EQ(third.state().batches, 0);
}

// Numbered examples in shards of the given sizes; example i lies at byte 1000 * i of its shard.
class Shards : public fabric::TensorDataset {
 public:
  explicit Shards(std::vector<int64_t> sizes)
      : fabric::TensorDataset(torch::arange(60).view({60, 1}), torch::arange(60)),
        sizes_(std::move(sizes)) {}
  std::vector<int64_t> shard_sizes() const override { return sizes_; }
  std::pair<int64_t, int64_t> locate(int64_t index) const override {
    int64_t shard = 0;
    while (index >= sizes_[static_cast<size_t>(shard)])
      index -= sizes_[static_cast<size_t>(shard++)];
    return {shard, 1000 * index};
  }

 private:
  std::vector<int64_t> sizes_;
};

// A streamed loader's checkpoint holds rank 0's stream position: the same shards resume exactly;
// shards cut differently (same examples, other shard sizes) or another buffer are refused.
TEST_F(CheckpointTest, StreamedLoaderResumesExactlyAndRefusesMovedShards) {
  fabric::Fabric f(config(), kCpu);
  auto options = fabric::DataLoaderOptions().batch_size(4).shuffle(true).seed(3).shuffle_buffer(9);
  auto shards = std::make_shared<Shards>(std::vector<int64_t>{25, 10, 25});
  fabric::DataLoader reference(shards, options);
  std::vector<torch::Tensor> expected;
  for (auto& batch : reference) expected.push_back(batch.target.clone());

  fabric::DataLoader first(shards, options);
  int taken = 0;
  for (auto& batch : first) {
    (void)batch;
    if (++taken == 5) break;
  }
  fabric::CheckpointState saving;
  saving.add("loader", first);
  const fs::path file = dir_ / "stream.ckpt";
  f.save(file.string(), saving);

  fabric::DataLoader second(shards, options);
  fabric::CheckpointState loading;
  loading.add("loader", second);
  f.load(file.string(), loading);
  std::vector<torch::Tensor> rest;
  for (auto& batch : second) rest.push_back(batch.target.clone());
  ASSERT_EQ(rest.size() + 5, expected.size());
  for (size_t i = 0; i < rest.size(); ++i)
    EXPECT_TRUE(torch::equal(rest[i], expected[5 + i])) << "batch " << i;

  auto expect_refused = [&](std::shared_ptr<const fabric::Dataset> data,
                            fabric::DataLoaderOptions o, const std::string& change) {
    fabric::DataLoader other(std::move(data), o);
    fabric::CheckpointState state;
    state.add("loader", other);
    try {
      f.load(file.string(), state);
      FAIL() << "resumed although " << change;
    } catch (const fabric::Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("cannot resume in the middle of epoch 0 (after batch 5 of 15): the "
                             "data order changed (" +
                             change),
                std::string::npos)
          << message;
    }
  };
  const auto [shard, offset] = first.stream_position({0, 5}, 0);
  auto recut = std::make_shared<Shards>(std::vector<int64_t>{20, 20, 20});
  const auto [new_shard, new_offset] =
      fabric::DataLoader(recut, options).stream_position({0, 5}, 0);
  ASSERT_TRUE(shard != new_shard || offset != new_offset) << "the test needs a moved position";
  std::string moved;
  if (shard != new_shard)
    moved = "stream_shard " + std::to_string(shard) + " → " + std::to_string(new_shard);
  if (offset != new_offset)
    moved += (moved.empty() ? "" : ", ") + std::string("stream_offset ") + std::to_string(offset) +
             " → " + std::to_string(new_offset);
  expect_refused(recut, options, moved);
  auto other_buffer = options;
  other_buffer.shuffle_buffer(16);
  expect_refused(shards, other_buffer, "shuffle_buffer 9 → 16");
}

TEST_F(CheckpointTest, SaveLoadRestoresEverythingAndRefusesBadInput) {
  fabric::Fabric f(config(), kCpu);
  torch::manual_seed(0);
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  train(model, opt, 2, 1);
  fabric::LRScheduler scheduler(opt, fabric::LRSchedule::cosine(0.1, 10));
  scheduler.step();
  int64_t count = 5;
  std::string note = "hello";
  torch::Tensor best = torch::tensor({0.5});
  fabric::CheckpointState state;
  state.add("model", model).add("optimizer", opt).add("scheduler", scheduler);
  state.add("count", count).add("note", note).add("best", best);
  const fs::path file = dir_ / "a.ckpt";
  f.save(file.string(), state);
  const auto rng_after_save = torch::rand({3});

  // A fresh set of objects gets everything back, the CPU generator included.
  auto model2 = make_model();
  torch::optim::SGD opt2(model2->parameters(), torch::optim::SGDOptions(0.3));
  fabric::LRScheduler scheduler2(opt2, fabric::LRSchedule::cosine(0.1, 10));
  int64_t count2 = 0;
  std::string note2;
  torch::Tensor best2;
  fabric::CheckpointState state2;
  state2.add("model", model2).add("optimizer", opt2).add("scheduler", scheduler2);
  state2.add("count", count2).add("note", note2).add("best", best2);
  f.load(file.string(), state2);
  EXPECT_TRUE(torch::equal(torch::rand({3}), rng_after_save));
  EXPECT_EQ(count2, 5);
  EXPECT_EQ(note2, "hello");
  EXPECT_TRUE(torch::equal(best2, best));
  EXPECT_EQ(scheduler2.current_step(), 1);
  EXPECT_DOUBLE_EQ(opt2.param_groups()[0].options().get_lr(), scheduler.get_lr());
  for (size_t i = 0; i < model->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(model->parameters()[i], model2->parameters()[i]));

  // Another model: one line naming the file, the entry and the shapes; nothing changed.
  auto wide = make_model(7);
  const auto before = wide->parameters()[0].clone();
  fabric::CheckpointState wrong;
  wrong.add("model", wide).add("optimizer", opt2).add("scheduler", scheduler2);
  wrong.add("count", count2).add("note", note2).add("best", best2);
  count2 = -1;
  const std::string shape_error = error_of([&] { f.load(file.string(), wrong); });
  EXPECT_EQ(shape_error.find('\n'), std::string::npos);
  EXPECT_EQ(
      shape_error.rfind(file.string() + ": model: does not match the model: shape of 0.weight "
                                        "is [6, 4] in the file, [7, 4] in the model",
                        0),
      0u)
      << shape_error;
  EXPECT_TRUE(torch::equal(wide->parameters()[0], before));
  EXPECT_EQ(count2, -1);

  // Entries missing from the file or unknown to the state.
  fabric::CheckpointState fewer;
  int64_t extra = 0;
  fewer.add("model", model2).add("extra", extra);
  EXPECT_EQ(error_of([&] { f.load(file.string(), fewer); }),
            file.string() +
                ": entries differ: missing [extra]; unexpected [optimizer, scheduler, "
                "count, note, best]");
  f.load(file.string(), fewer, /*strict=*/false);  // skips them with a warning

  // Bad files: one line naming the file and the problem.
  EXPECT_EQ(error_of([&] { f.load((dir_ / "absent.ckpt").string(), state2); }),
            (dir_ / "absent.ckpt").string() + ": cannot open (No such file or directory)");
  std::ofstream(dir_ / "random.ckpt") << std::string(1000, '\x5a');
  EXPECT_EQ(error_of([&] {
              f.load((dir_ / "random.ckpt").string(), state2);
            }).rfind((dir_ / "random.ckpt").string() + ": not a readable PyTorch file (", 0),
            0u);
  fs::copy_file(file, dir_ / "truncated.ckpt");
  fs::resize_file(dir_ / "truncated.ckpt", fs::file_size(file) - 100);
  EXPECT_EQ(error_of([&] {
              f.load((dir_ / "truncated.ckpt").string(), state2);
            }).rfind((dir_ / "truncated.ckpt").string() + ": not a readable PyTorch file (", 0),
            0u);
  fabric::save_state_dict(dir_ / "weights.pt", fabric::state_dict(*model));
  EXPECT_EQ(error_of([&] { f.load((dir_ / "weights.pt").string(), state2); }),
            (dir_ / "weights.pt").string() +
                ": not a Fabric++ checkpoint (no \"fabric\" entry; for a state dict of weights use "
                "load_weights)");
  c10::impl::GenericDict future(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericDict meta(c10::StringType::get(), c10::AnyType::get());
  meta.insert("format_version", int64_t{99});
  future.insert("fabric", meta);
  fabric::save_archive(dir_ / "future.ckpt", future);
  EXPECT_EQ(error_of([&] { f.load((dir_ / "future.ckpt").string(), state2); }),
            (dir_ / "future.ckpt").string() +
                ": checkpoint format 99 is newer than this build reads (1); load it with a newer "
                "Fabric++");

  // An unwritable place: one line; the checkpoint written before is untouched.
  std::ofstream(dir_ / "plain_file") << "x";
  const std::string unwritable = (dir_ / "plain_file" / "b.ckpt").string();
  EXPECT_EQ(error_of([&] {
              f.save(unwritable, state);
            }).rfind("cannot write " + unwritable + ": cannot create " + unwritable + ".tmp.", 0),
            0u);
  EXPECT_NO_THROW(f.load(file.string(), state2));
}

TEST_F(CheckpointTest, ConfigDifferencesAreListedAndCheckpointKeysIgnored) {
  const auto a = config({"optimizer.lr=0.1", "checkpoint.resume=none"});
  const auto b = config({"optimizer.lr=0.05", "checkpoint.resume=auto", "trainer.max_epochs=20"});
  EXPECT_EQ(fabric::config_differences(a.to_yaml(), b.to_yaml(), {"checkpoint", "logging"}),
            (std::vector<std::string>{"optimizer.lr 0.1 → 0.05", "trainer.max_epochs 10 → 20"}));
  EXPECT_TRUE(fabric::config_differences(a.to_yaml(), a.to_yaml()).empty());

  fabric::Fabric saver(a, kCpu);
  auto model = make_model();
  fabric::CheckpointState state;
  state.add("model", model);
  const fs::path file = dir_ / "c.ckpt";
  saver.save(file.string(), state);
  fabric::Fabric loader(b, kCpu);
  ::testing::internal::CaptureStderr();
  loader.load(file.string(), state);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("warning: " + file.string() +
                     ": the config differs: optimizer.lr 0.1 → 0.05; trainer.max_epochs 10 → 20"),
            std::string::npos)
      << err;
  // A checkpoint that does not fit: the keys that differ end the error (they usually say why).
  fabric::CheckpointState more;
  int64_t extra = 0;
  more.add("model", model).add("extra", extra);
  EXPECT_EQ(error_of([&] { loader.load(file.string(), more); }),
            file.string() +
                ": entries differ: missing [extra]; the config differs from the checkpoint's: "
                "optimizer.lr 0.1 → 0.05; trainer.max_epochs 10 → 20; resume with the "
                "checkpoint's values of those keys, or start a new run from its weights (`ckpt "
                "consolidate` writes them for model.init_weights)");
}

TEST_F(CheckpointTest, OptimizerKeysTheConfigChangedReplaceTheCheckpointsOptions) {
  const auto a = config({"optimizer.momentum=0.9", "optimizer.lr_scale=[\"0.*=2\"]"});
  // optimizer.betas changes too: SGD has none, so the line names momentum alone.
  const auto b = config(
      {"optimizer.momentum=0.5", "optimizer.betas=[0.8, 0.9]", "optimizer.lr_scale=[\"0.*=3\"]"});
  auto model = make_model();
  auto sgd = [&](double momentum) {
    return std::make_unique<torch::optim::SGD>(
        model->parameters(), torch::optim::SGDOptions(0.1).momentum(momentum).weight_decay(1e-4));
  };
  auto options = [](torch::optim::Optimizer& o) -> torch::optim::SGDOptions& {
    return static_cast<torch::optim::SGDOptions&>(o.param_groups()[0].options());
  };
  const fs::path file = dir_ / "o.ckpt";
  {
    fabric::Fabric saver(a, kCpu);
    auto opt = sgd(0.9);
    options(*opt).dampening(0.25);  // changed by the program, not by a config key
    fabric::CheckpointState state;
    state.add("model", model).add("optimizer", *opt);
    saver.save(file.string(), state);
  }
  // optimizer.momentum changed: the config's 0.5 (the optimizer as built now) wins; the rest is the
  // checkpoint's, as torch.optim's load_state_dict restores it.
  fabric::Fabric changed(b, kCpu);
  auto opt = sgd(0.5);
  fabric::CheckpointState state;
  state.add("model", model).add("optimizer", *opt);
  ::testing::internal::CaptureStderr();
  changed.load(file.string(), state);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_DOUBLE_EQ(options(*opt).momentum(), 0.5);
  EXPECT_DOUBLE_EQ(options(*opt).dampening(), 0.25);
  EXPECT_NE(err.find("the config's optimizer.momentum 0.5 replaced the checkpoint's"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("optimizer.lr_scale: the checkpoint's parameter groups and their rates are "
                     "kept"),
            std::string::npos)
      << err;
  // The same config as the saver's: every option is the checkpoint's (0.9, not the built 0.5).
  fabric::Fabric same(a, kCpu);
  auto again = sgd(0.5);
  fabric::CheckpointState state2;
  state2.add("model", model).add("optimizer", *again);
  same.load(file.string(), state2);
  EXPECT_DOUBLE_EQ(options(*again).momentum(), 0.9);
  EXPECT_DOUBLE_EQ(options(*again).dampening(), 0.25);
}

TEST_F(CheckpointTest, PythonReadsACheckpoint) {
  fabric::Fabric f(config(), kCpu);
  auto model = make_model();
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(0.01));
  train(model, opt, 1, 1);
  fabric::CheckpointState state;
  state.add("model", model).add("optimizer", opt);
  const fs::path file = dir_ / "py.ckpt";
  f.save(file.string(), state);
  const fs::path script = dir_ / "read.py";
  std::ofstream(script) << "import sys, torch\n"
                           "c = torch.load(sys.argv[1], weights_only=True)\n"
                           "s = c['state']\n"
                           "print(c['fabric']['format_version'], sorted(s['model']),\n"
                           "      s['optimizer']['type'], s['optimizer']['state'][0]['step'],\n"
                           "      '%.6f' % s['model']['0.weight'].double().sum().item())\n";
  const auto r = fabric::testing::run_command(fabric::testing::python_interpreter() + " " +
                                              script.string() + " " + file.string());
  ASSERT_EQ(r.code, 0) << r.out;
  char sum[32];
  std::snprintf(sum, sizeof(sum), "%.6f",
                model->parameters()[0].to(torch::kDouble).sum().item<double>());
  std::string last = r.out.substr(0, r.out.size() - 1);  // (torch may warn first: no NumPy)
  last = last.substr(last.rfind('\n') + 1) + "\n";
  EXPECT_EQ(last,
            std::string("1 ['0.bias', '0.weight', '2.bias', '2.weight'] AdamW 1 ") + sum + "\n");
}

}  // namespace
