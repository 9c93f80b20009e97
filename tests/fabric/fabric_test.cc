// The Fabric loop against the same loop written directly on LibTorch: bitwise equal on CPU; and
// what Fabric keeps for a program (run directory, checkpoints, summary).
#include "fabric/fabric.h"

#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "fabric/checkpointer.h"
#include "fabric/connector.h"
#include "fabric/core/atomic_file.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(torch::relu(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

std::shared_ptr<fabric::TensorDataset> data() {
  torch::manual_seed(123);
  auto x = torch::randn({64, 8});
  auto y = torch::randint(0, 3, {64});
  return std::make_shared<fabric::TensorDataset>(x, y);
}

fabric::Config config(const std::vector<std::string>& overrides = {}) {
  return fabric::Config::defaults(fabric::training_schema(), overrides);
}

const fabric::MachineFacts kCpu;  // no CUDA, no launch variables: one CPU process

std::vector<torch::Tensor> train_with_fabric(const fabric::Config& c, int epochs) {
  fabric::Fabric fabric(c, kCpu);
  std::vector<torch::Tensor> params;
  fabric.launch([&](fabric::Fabric& f) {
    Net model;
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    f.setup(model, optimizer);
    auto loader =
        f.setup_dataloader(data(), fabric::DataLoaderOptions().batch_size(16).shuffle(true));
    for (int e = 0; e < epochs; ++e) {
      for (fabric::Batch& batch : loader) {
        optimizer.zero_grad();
        torch::Tensor loss;
        {
          auto guard = f.autocast();
          loss = torch::cross_entropy_loss(model->forward(batch.data), batch.target);
        }
        f.backward(loss);
        f.step(optimizer);
      }
    }
    for (auto& p : model->parameters()) params.push_back(p.detach().clone());
  });
  return params;
}

std::vector<torch::Tensor> train_by_hand(uint64_t seed, int epochs) {
  torch::manual_seed(seed);
  Net model;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto ds = data();
  fabric::DistributedSampler sampler(ds->size(), 1, 0, true, seed);
  for (int e = 0; e < epochs; ++e) {
    sampler.set_epoch(e);
    const auto order = sampler.indices();
    for (size_t i = 0; i < order.size(); i += 16) {
      auto batch = ds->get_batch(std::vector<int64_t>(order.begin() + i, order.begin() + i + 16));
      optimizer.zero_grad();
      torch::cross_entropy_loss(model->forward(batch.data), batch.target).backward();
      optimizer.step();
    }
  }
  std::vector<torch::Tensor> params;
  for (auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

TEST(FabricTest, LoopEqualsTheHandWrittenLibTorchLoopBitwise) {
  auto ours = train_with_fabric(config({"fabric.seed=9"}), 3);
  auto theirs = train_by_hand(9, 3);
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 0; i < ours.size(); ++i)
    EXPECT_TRUE(torch::equal(ours[i], theirs[i])) << "param " << i;
}

TEST(FabricTest, SameSeedSameResultDifferentSeedDifferentResult) {
  auto a = train_with_fabric(config({"fabric.seed=3"}), 1);
  auto b = train_with_fabric(config({"fabric.seed=3"}), 1);
  auto c = train_with_fabric(config({"fabric.seed=4"}), 1);
  EXPECT_TRUE(torch::equal(a[0], b[0]));
  EXPECT_FALSE(torch::equal(a[0], c[0]));
}

TEST(FabricTest, PrecisionsConvertAndTrain) {
  for (const char* p : {"64-true", "bf16-true", "bf16-mixed", "16-mixed"}) {
    fabric::Fabric fabric(config({std::string("fabric.precision=") + p}), kCpu);
    fabric.launch([&](fabric::Fabric& f) {
      Net model;
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
      f.setup(model, optimizer);
      auto loader = f.setup_dataloader(data(), fabric::DataLoaderOptions().batch_size(32));
      const auto before = model->fc1->weight.detach().clone();
      for (fabric::Batch& batch : loader) {
        optimizer.zero_grad();
        torch::Tensor loss;
        {
          auto guard = f.autocast();
          loss = torch::cross_entropy_loss(model->forward(f.precision().convert_input(batch.data)),
                                           batch.target);
        }
        EXPECT_TRUE(loss.isfinite().item<bool>()) << p;
        f.backward(loss);
        const double norm = f.clip_gradients(model, optimizer, 1.0);
        EXPECT_GT(norm, 0.0) << p;
        EXPECT_TRUE(f.step(optimizer)) << p;
      }
      const auto want = std::string(p) == "64-true"     ? torch::kDouble
                        : std::string(p) == "bf16-true" ? torch::kBFloat16
                                                        : torch::kFloat;
      EXPECT_EQ(model->fc1->weight.scalar_type(), want) << p;
      EXPECT_FALSE(
          torch::equal(model->fc1->weight.detach().to(torch::kFloat), before.to(torch::kFloat)))
          << p;
    });
  }
}

// data.num_workers=1000 on a small machine: bounded (each thread holds batches in flight) with one
// warning line; a sensible count is kept.
TEST(FabricTest, LoaderThreadsAreBoundedByTheCpus) {
  fabric::Fabric f(config({"fabric.num_threads=3"}), kCpu);
  testing::internal::CaptureStdout();
  auto many = f.setup_dataloader(data(), fabric::DataLoaderOptions().num_workers(1000));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(many.options().num_workers(), 12);
  EXPECT_NE(out.find("warning: data.num_workers: 1000 loader threads for 3 CPU(s) per process; "
                     "using 12 (at most max(8, 4 per CPU): more only add memory)"),
            std::string::npos)
      << out;
  EXPECT_EQ(f.setup_dataloader(data(), fabric::DataLoaderOptions().num_workers(5))
                .options()
                .num_workers(),
            5);
}

TEST(FabricTest, PropertiesDescribeASingleProcess) {
  fabric::Fabric fabric(config(), kCpu);
  EXPECT_EQ(fabric.world_size(), 1);
  EXPECT_EQ(fabric.global_rank(), 0);
  EXPECT_TRUE(fabric.is_global_zero());
  EXPECT_TRUE(fabric.device().is_cpu());
  auto t = torch::ones({2});
  EXPECT_TRUE(torch::equal(fabric.all_reduce(t), t));
  EXPECT_TRUE(torch::equal(fabric.broadcast(t), t));
  EXPECT_THROW(fabric.broadcast(t, 1), fabric::Error);
}

// Fabric::init_module under fabric.empty_init: no memory until setup, then a full init's values;
// a constructor that reads a value fails with one line naming the key.
TEST(FabricTest, InitModuleBuildsEmptyAndSetupGivesAFullInitsValues) {
  fabric::Fabric fabric(config({"fabric.empty_init=true"}), kCpu);
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(5);
    Net full;
    torch::manual_seed(5);
    Net model = f.init_module([] { return Net(); });
    EXPECT_TRUE(model->fc1->weight.is_meta());
    auto optimizer = torch::optim::SGD(model->parameters(), 0.1);  // before setup, on meta
    f.setup(model, optimizer);
    EXPECT_FALSE(model->fc1->weight.is_meta());
    EXPECT_TRUE(torch::equal(model->fc1->weight, full->fc1->weight));
    EXPECT_TRUE(torch::equal(model->fc2->bias, full->fc2->bias));
    Net eager = f.init_module([] { return Net(); }, /*empty_init=*/false);
    EXPECT_FALSE(eager->fc1->weight.is_meta());
    try {
      f.init_module([] {
        Net n;
        return n->fc1->weight.sum().item<double>();  // reads a value
      });
      FAIL() << "no error";
    } catch (const fabric::Error& e) {
      EXPECT_NE(std::string(e.what()).find("init_module: the model's constructor failed on the "
                                           "meta device of an empty init"),
                std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("set fabric.empty_init: false"), std::string::npos);
    }
    // A second recording after a failed one starts cleanly.
    Net again = f.init_module([] { return Net(); });
    EXPECT_TRUE(again->fc1->weight.is_meta());
    // Loading a checkpoint into it before setup: refused (the copy into meta tensors was lost
    // and setup replayed the random init: a "resume" from fresh weights).
    const std::string file = ::testing::TempDir() + "/empty_init_load.ckpt";
    fabric::CheckpointState saved;
    saved.add("model", model);
    f.save(file, saved);
    fabric::CheckpointState state;
    state.add("model", again);
    try {
      f.load(file, state);
      FAIL() << "no error";
    } catch (const fabric::Error& e) {
      EXPECT_NE(std::string(e.what()).find("empty_init_load.ckpt: the module of entry 'model' was "
                                           "built by an empty init (init_module) and has no "
                                           "memory until setup(); load after setup"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(FabricTest, SaveAndLoadWeightsRoundTripAndReportBadPaths) {
  fabric::Fabric fabric(config(), kCpu);
  fabric.launch([&](fabric::Fabric& f) {
    Net model;
    const std::string file = ::testing::TempDir() + "/fabric_weights.pt";
    f.save_weights(model, file);
    const auto saved = model->fc1->weight.detach().clone();
    {
      torch::NoGradGuard no_grad;
      model->fc1->weight.add_(1.0);
    }
    f.load_weights(model, file);
    EXPECT_TRUE(torch::equal(model->fc1->weight, saved));
    std::ofstream(::testing::TempDir() + "/not_a_dir") << "x";
    EXPECT_THROW(f.save_weights(model, ::testing::TempDir() + "/not_a_dir/w.pt"), fabric::Error);
    EXPECT_THROW(f.load_weights(model, ::testing::TempDir() + "/absent.pt"), fabric::Error);
  });
}

// The bookkeeping a program need not write: the run directory named after the program, the
// Checkpointer in it, and summary.json with the last value of each logged metric, unless the
// program wrote its own.
TEST(FabricTest, RunDirectoryCheckpointsAndSummaryComeWithoutBookkeeping) {
  const std::string root = ::testing::TempDir() + "/bookkeeping";
  std::error_code ec;
  fabric::remove_tree(root, ec);
  fabric::Fabric fabric(config({"logging.run_dir=" + root + "/{name}", "logging.loggers=[csv]"}),
                        kCpu);
  std::filesystem::path run;
  fabric.launch([&](fabric::Fabric& f) {
    Net model;
    torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05));
    f.setup(model, optimizer);
    fabric::CheckpointState state;
    state.add("model", model).add("optimizer", optimizer);
    fabric::Checkpointer checkpoints(f, state);
    run = f.run_directory().path();
    EXPECT_EQ(checkpoints.dir(), run / "checkpoints");
    f.log("test/accuracy", 0.5, 1);
    f.log_dict({{"test/accuracy", 0.75}, {"train/loss", 2.0}}, 2);
    checkpoints.finish();
  });
  EXPECT_EQ(run, std::filesystem::path(root) / "fabric_test");  // the program's file name
  std::ifstream in(run / "summary.json");
  const std::string summary((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(summary.find("\"test/accuracy\": 0.75"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"train/loss\": 2.0"), std::string::npos) << summary;
  EXPECT_NE(summary.find("\"exit_status\": 0"), std::string::npos) << summary;
  EXPECT_TRUE(std::filesystem::exists(run / "checkpoints" / "latest"));

  fabric::Fabric own(config({"logging.run_dir=" + root + "/own"}), kCpu);
  own.launch([&](fabric::Fabric& f) {
    f.create_run_directory("mine").write_summary(nlohmann::json{{"score", 1}});
    f.log("score", 2.0, 1);
  });
  std::ifstream mine(std::filesystem::path(root) / "own" / "summary.json");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(mine)), {}).find("exit_status"),
            std::string::npos);
}

// The checkpoint: keys are read once (CheckpointerOptions::from_config): a bad pattern is an error
// at its key there; afterwards the options alone say where resume: auto looks, and the folders of
// earlier runs are found on disk when asked (a run made after from_config counts).
TEST(FabricTest, CheckpointerOptionsComeFromTheConfigOnce) {
  namespace fs = std::filesystem;
  const fs::path root = fs::path(::testing::TempDir()) / "checkpointer_options";
  std::error_code ec;
  fabric::remove_tree(root, ec);
  const fabric::Config c = config({"logging.run_dir=" + (root / "{name}/{timestamp}").string(),
                                   "checkpoint.every_n_steps=7", "checkpoint.async=true"});
  const fs::path now = root / "prog" / "20261126-120000";
  fs::create_directories(root / "prog" / "20261125-080000" / "checkpoints");
  const auto o = fabric::CheckpointerOptions::from_config(c, "prog", now);
  EXPECT_EQ(o.dir, now / "checkpoints");
  EXPECT_EQ(o.every_n_steps, 7);
  EXPECT_TRUE(o.async);
  EXPECT_EQ(o.export_weights, (now / "weights.pt").string());
  fs::create_directories(root / "prog" / "20261125-090000-1");  // made later, found too
  fs::create_directories(root / "prog" / "not-a-run");
  auto dirs = o.search_dirs();
  std::sort(dirs.begin(), dirs.end());
  EXPECT_EQ(dirs, (std::vector<fs::path>{root / "prog" / "20261125-080000" / "checkpoints",
                                         root / "prog" / "20261125-090000-1" / "checkpoints"}));

  // A fixed folder is searched alone.
  const auto fixed = fabric::CheckpointerOptions::from_config(
      config({"checkpoint.dir=" + (root / "fixed").string()}), "prog", now);
  EXPECT_EQ(fixed.search_dirs(), std::vector<fs::path>{root / "fixed"});

  try {
    fabric::CheckpointerOptions::from_config(config({"checkpoint.dir=ckpt/{step}"}), "prog", now);
    ADD_FAILURE() << "an unknown field was accepted";
  } catch (const fabric::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("checkpoint.dir"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("{step}"), std::string::npos) << e.what();
  }
}

}  // namespace
