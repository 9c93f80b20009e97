// Whole-step CUDA graphs (fabric/graphed_step.h; tag `gpu`, skips without a CUDA device):
// steps replayed from the graph train as eager steps do (same parameters within float tolerance,
// through an LR schedule, in 32-true, bf16-mixed and 16-mixed with the GradScaler on the device,
// for fused SGD and AdamW); a batch of another shape runs eagerly; a loss function that waits for
// the host cannot be captured and says so, leaving nothing behind (the next call captures and
// replays); another thread pinning memory and copying batches during the capture does not break
// it; a non-fused optimizer is refused; an eager 16-mixed step never synchronizes with the host;
// under ddp (NCCL, world size 1) the all-reduce is captured.
#include <gtest/gtest.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/fabric.h"
#include "fabric/graphed_step.h"
#include "fabric/training/fast_optimizers.h"
#include "tests/cuda_skip.h"

namespace {

struct Trained {
  std::vector<torch::Tensor> params;
  int64_t replays = 0, eager = 0;
  double last_norm = -1;  // GraphedStep::grad_norm() after the last step (clip_norm only)
};

Trained train(const std::string& precision, const std::string& optimizer_name, bool graphs,
              int steps, int odd_step = -1, const std::string& strategy = "single_device",
              const fabric::GraphedStepOptions& options = {}) {
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(), {"fabric.accelerator=cuda", "fabric.devices=1",
                                  "fabric.strategy=" + strategy, "fabric.precision=" + precision,
                                  std::string("fabric.cuda_graphs=") + (graphs ? "true" : "false"),
                                  "fabric.cudnn_benchmark=false", "fabric.deterministic=true"}));
  Trained out;
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(5);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 10));
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (optimizer_name == "sgd") {
      optimizer = std::make_unique<fabric::SGD>(
          model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
    } else {
      optimizer =
          std::make_unique<fabric::AdamW>(model->parameters(), torch::optim::AdamWOptions(1e-3));
    }
    f.setup(model, *optimizer);
    fabric::GraphedStep step(
        f, *optimizer,
        [&](const std::vector<torch::Tensor>& batch) {
          auto autocast = f.autocast();
          return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
        },
        options);
    EXPECT_EQ(step.graphed(), graphs);
    for (int k = 0; k < steps; ++k) {
      for (auto& g : optimizer->param_groups()) g.options().set_lr(g.options().get_lr() * 0.95);
      torch::manual_seed(1000 + k);
      const int64_t n = k == odd_step ? 24 : 64;
      step({torch::randn({n, 32}).to(f.device()), torch::randint(0, 10, {n}).to(f.device())});
    }
    out.replays = step.replays();
    if (step.grad_norm().defined()) out.last_norm = step.grad_norm().item<double>();
    out.eager = step.eager_steps();
    for (const auto& p : model->parameters()) out.params.push_back(p.detach().cpu());
  });
  return out;
}

double max_relative_difference(const Trained& a, const Trained& b) {
  double worst = 0;
  for (size_t i = 0; i < a.params.size(); ++i)
    worst = std::max(
        worst, ((a.params[i] - b.params[i]).abs().max() / b.params[i].abs().max().clamp_min(1e-12))
                   .item<double>());
  return worst;
}

TEST(CudaGraphsTest, ReplayedStepsTrainAsEagerStepsDo) {
  SKIP_WITHOUT_CUDA();
  for (const char* precision : {"32-true", "bf16-mixed", "16-mixed"}) {
    for (const char* optimizer : {"sgd", "adamw"}) {
      SCOPED_TRACE(std::string(precision) + " " + optimizer);
      const Trained eager = train(precision, optimizer, false, 12);
      const Trained graphed = train(precision, optimizer, true, 12);
      EXPECT_EQ(graphed.eager, 3);  // warm-up
      EXPECT_EQ(graphed.replays, 9);
      EXPECT_LT(max_relative_difference(graphed, eager), 1e-4);
      // Training moved the parameters: a graph that replays nothing would fail the comparison.
      const Trained fewer = train(precision, optimizer, false, 11);
      EXPECT_GT(max_relative_difference(fewer, eager), 1e-6);
    }
  }
}

// DDP over NCCL (world size 1): the graph holds the gradient all-reduce and the buffer broadcast;
// replayed steps train as the Reducer's eager steps do.
TEST(CudaGraphsTest, DdpReplaysTheAllReduceAndTrainsAsEagerDdp) {
  SKIP_WITHOUT_CUDA();
  for (const char* precision : {"32-true", "16-mixed"}) {
    SCOPED_TRACE(precision);
    const Trained eager = train(precision, "sgd", false, 10, -1, "ddp");
    const Trained graphed = train(precision, "sgd", true, 10, -1, "ddp");
    EXPECT_EQ(graphed.eager, 3);
    EXPECT_EQ(graphed.replays, 7);
    EXPECT_LT(max_relative_difference(graphed, eager), 1e-4);
    const Trained single = train(precision, "sgd", true, 10);
    EXPECT_LT(max_relative_difference(graphed, single), 1e-4);
  }
}

// Clipping by norm inside the step (unscale, norm, scale on the device) is captured too.
TEST(CudaGraphsTest, ClippedStepsAreCapturedAndTrainAsEagerOnes) {
  SKIP_WITHOUT_CUDA();
  fabric::GraphedStepOptions clip;
  clip.clip_norm(0.1);
  for (const char* precision : {"32-true", "16-mixed"}) {
    SCOPED_TRACE(precision);
    const Trained eager = train(precision, "sgd", false, 10, -1, "single_device", clip);
    const Trained graphed = train(precision, "sgd", true, 10, -1, "single_device", clip);
    EXPECT_EQ(graphed.replays, 7);
    EXPECT_LT(max_relative_difference(graphed, eager), 1e-4);
    ASSERT_GT(eager.last_norm, 0);
    EXPECT_NEAR(graphed.last_norm, eager.last_norm, 1e-3 * eager.last_norm);  // the replay's norm
    const Trained unclipped = train(precision, "sgd", false, 10);
    EXPECT_GT(max_relative_difference(unclipped, eager), 1e-6);
  }
}

TEST(CudaGraphsTest, ABatchOfAnotherShapeRunsEagerly) {
  SKIP_WITHOUT_CUDA();
  const Trained eager = train("32-true", "sgd", false, 10, 7);
  const Trained graphed = train("32-true", "sgd", true, 10, 7);
  EXPECT_EQ(graphed.eager, 4);  // 3 warm-up + the odd batch
  EXPECT_EQ(graphed.replays, 6);
  EXPECT_LT(max_relative_difference(graphed, eager), 1e-4);
}

TEST(CudaGraphsTest, AStepThatWaitsForTheHostCannotBeCapturedAndSaysSo) {
  SKIP_WITHOUT_CUDA();
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(),
      {"fabric.accelerator=cuda", "fabric.devices=1", "fabric.cuda_graphs=true"}));
  fabric.launch([&](fabric::Fabric& f) {
    torch::nn::Linear model(8, 2);
    fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
    f.setup(model, optimizer);
    fabric::GraphedStep step(f, optimizer, [&](const std::vector<torch::Tensor>& batch) {
      torch::Tensor loss = model->forward(batch[0]).pow(2).mean();
      if (loss.item<double>() < 0) return loss * 2;  // a host sync
      return loss;
    });
    const std::vector<torch::Tensor> batch = {torch::randn({4, 8}).to(f.device())};
    for (int k = 0; k < 3; ++k) step(batch);  // eager warm-up is fine
    try {
      step(batch);
      ADD_FAILURE() << "the capture did not fail";
    } catch (const fabric::Error& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be captured as a CUDA graph"), std::string::npos)
          << e.what();
    }
    torch::optim::SGD plain(model->parameters(), torch::optim::SGDOptions(0.1));
    EXPECT_THROW(fabric::GraphedStep(
                     f, plain, [](const std::vector<torch::Tensor>& b) { return b[0].sum(); }),
                 fabric::Error);
  });
}

// Hot-path hygiene: an eager 16-mixed step with the fused optimizer (GradScaler skip and update on
// the device) on device-resident data never waits for the GPU: CUDA's sync debug mode set to
// error throws at the first synchronizing call (.item(), a device-to-host copy, nonzero, ...).
TEST(CudaGraphsTest, AnEagerMixedPrecisionStepNeverSynchronizes) {
  SKIP_WITHOUT_CUDA();
#ifdef FABRIC_WITH_CUDA
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(),
      {"fabric.accelerator=cuda", "fabric.devices=1", "fabric.precision=16-mixed"}));
  fabric.launch([&](fabric::Fabric& f) {
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 10));
    fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    f.setup(model, optimizer);
    fabric::GraphedStep step(f, optimizer, [&](const std::vector<torch::Tensor>& batch) {
      auto autocast = f.autocast();
      return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
    });
    const std::vector<torch::Tensor> batch = {torch::randn({64, 32}).to(f.device()),
                                              torch::randint(0, 10, {64}).to(f.device())};
    step(batch);  // first step: state and caches made
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    try {
      for (int k = 0; k < 5; ++k) step(batch);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a step synchronized with the host: " << e.what();
    }
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  });
#endif
}

// A failed capture leaves nothing behind: once the loss function stops waiting for the host, the
// next call captures and replays, and training matches eager steps on the same batches.
TEST(CudaGraphsTest, AFailedCaptureLeavesNothingBehindAndTheNextCallRetries) {
  SKIP_WITHOUT_CUDA();
  auto run = [](bool graphs, bool fail_once) {
    fabric::Fabric fabric(fabric::Config::defaults(
        fabric::training_schema(),
        {"fabric.accelerator=cuda", "fabric.devices=1", "fabric.deterministic=true",
         std::string("fabric.cuda_graphs=") + (graphs ? "true" : "false")}));
    Trained out;
    fabric.launch([&](fabric::Fabric& f) {
      torch::manual_seed(5);
      torch::nn::Linear model(16, 4);
      fabric::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      f.setup(model, optimizer);
      bool sync = false;
      fabric::GraphedStep step(f, optimizer, [&](const std::vector<torch::Tensor>& batch) {
        torch::Tensor loss = model->forward(batch[0]).pow(2).mean();
        if (sync && loss.item<double>() < 0) return loss * 2;  // waits for the host
        return loss;
      });
      for (int k = 0; k < 8; ++k) {
        torch::manual_seed(100 + k);
        const std::vector<torch::Tensor> batch = {torch::randn({8, 16}).to(f.device())};
        if (fail_once && k == 3) {
          sync = true;
          EXPECT_THROW(step(batch), fabric::Error);
          sync = false;
        }
        step(batch);
      }
      out.replays = step.replays();
      out.eager = step.eager_steps();
      for (const auto& p : model->parameters()) out.params.push_back(p.detach().cpu());
    });
    return out;
  };
  const Trained eager = run(false, false);
  const Trained retried = run(true, true);
  EXPECT_EQ(retried.eager, 3);
  EXPECT_EQ(retried.replays, 5);
  EXPECT_LT(max_relative_difference(retried, eager), 1e-4);
}

// DataLoader workers pin host memory and copy the next batches on their own streams while the
// training thread captures: the capture checks only its own thread (thread-local mode).
TEST(CudaGraphsTest, AnotherThreadCopyingDuringTheCaptureDoesNotBreakIt) {
  SKIP_WITHOUT_CUDA();
#ifdef FABRIC_WITH_CUDA
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(),
      {"fabric.accelerator=cuda", "fabric.devices=1", "fabric.cuda_graphs=true"}));
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(5);
    torch::nn::Sequential model(torch::nn::Linear(32, 64), torch::nn::ReLU(),
                                torch::nn::Linear(64, 10));
    fabric::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-3));
    f.setup(model, optimizer);
    fabric::GraphedStep step(f, optimizer, [&](const std::vector<torch::Tensor>& batch) {
      return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
    });
    std::atomic<bool> stop{false};
    std::atomic<int64_t> copies{0};
    std::string loader_error;
    const torch::Device device = f.device();
    std::thread loader([&] {  // what a DataLoader worker does for every batch
      try {
        c10::cuda::CUDAGuard guard(device);
        c10::cuda::CUDAStreamGuard stream(c10::cuda::getStreamFromPool(false, device.index()));
        while (!stop) {
          torch::Tensor pinned = torch::randn({256, 32}).pin_memory();
          torch::Tensor on_gpu = pinned.to(device, /*non_blocking=*/true);
          c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
          ++copies;
        }
      } catch (const std::exception& e) {
        loader_error = e.what();
      }
    });
    try {
      for (int k = 0; k < 10; ++k) {
        const int64_t before = copies;
        while (copies == before && loader_error.empty()) std::this_thread::yield();  // overlap
        step({torch::randn({64, 32}).to(f.device()), torch::randint(0, 10, {64}).to(f.device())});
      }
    } catch (const std::exception& e) {
      ADD_FAILURE() << "a step failed while another thread copied: " << e.what();
    }
    stop = true;
    loader.join();
    EXPECT_EQ(loader_error, "");
    EXPECT_EQ(step.replays(), 7);
  });
#endif
}

}  // namespace
