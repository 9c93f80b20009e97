// GPU test helper for cuda_ranks_test: a self-launched Fabric job of 2 ranks sharing cuda:0
// (fabric.ddp.ranks_per_gpu=2: Gloo carries the CUDA tensors), configured as a user would.
//   cuda_ranks_helper overflow [KEY=VALUE...]  16-mixed; at step 3 rank 1's gradient of the last
//       bias turns inf (a tensor hook). Every rank must skip that step (Fabric::step false, the
//       weights untouched), take every other step alike, and end with the same weights. With
//       fabric.ddp.shard_optimizer_state=true only the rank owning that bias sees the inf after
//       the reduce-scatter: the GradScaler's found_inf agreement is what makes the others skip.
//   cuda_ranks_helper syncbn [KEY=VALUE...]    fabric.sync_batchnorm over the 2 ranks, each with
//       half of a global batch of 16, for 3 SGD steps; rank 0 also trains the same model (its
//       BatchNorm unsynchronized: no process group) on the whole batch in its own process: weights
//       and running statistics must agree to `max_rel` (printed).
// Prints "rank R: ..." lines; exits 0 when every check held on every rank, 1 otherwise, 77 when
// no GPU is usable.
#include <torch/cuda.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "fabric/fabric.h"
#include "fabric/main.h"
#include "fabric/nn/batch_norm.h"

namespace {

int64_t g_failures = 0;

void expect(bool ok, const fabric::Fabric& f, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "rank %lld: FAILED: %s\n", static_cast<long long>(f.global_rank()),
               what.c_str());
  ++g_failures;
}

// The model's parameters and buffers, flattened on the CPU (as float64).
torch::Tensor flat_state(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (const auto& p : m.parameters())
    parts.push_back(p.detach().cpu().to(torch::kDouble).flatten());
  for (const auto& b : m.buffers())
    if (b.is_floating_point()) parts.push_back(b.detach().cpu().to(torch::kDouble).flatten());
  return torch::cat(parts);
}

double max_rel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
}

void overflow(fabric::Fabric& f) {
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                              torch::nn::Linear(32, 4));
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  f.setup(model, opt);
  const torch::Tensor bias = model[2]->as<torch::nn::Linear>()->bias;
  std::vector<int64_t> stepped;
  const int64_t rank = f.global_rank();
  for (int64_t step = 1; step <= 6; ++step) {
    torch::manual_seed(100 + step * 10 + rank);
    auto x = f.to_device(torch::randn({8, 16}));
    auto y = f.to_device(torch::randn({8, 4}));
    opt.zero_grad();
    torch::Tensor loss;
    {
      auto guard = f.autocast();
      loss = torch::mse_loss(model->forward(x), y);
    }
    // Rank 1, step 3: an inf in one small gradient (before DDP or ZeRO reduce it).
    std::optional<unsigned> hook;
    if (rank == 1 && step == 3)
      hook = bias.register_hook(
          [](const torch::Tensor& g) { return g * std::numeric_limits<float>::infinity(); });
    f.backward(loss);
    if (hook) bias.remove_hook(*hook);
    const torch::Tensor before = flat_state(*model);
    const bool took = f.step(opt);
    stepped.push_back(took ? 1 : 0);
    const bool unchanged = torch::equal(before, flat_state(*model));
    expect(took != unchanged, f,
           "step " + std::to_string(step) + ": Fabric::step said " +
               (took ? "stepped" : "skipped") + " but the weights " +
               (unchanged ? "stayed" : "moved"));
  }
  expect(stepped[2] == 0, f, "step 3 (rank 1's inf gradient) was not skipped");
  const auto all_steps = f.all_gather(torch::tensor(stepped));
  const auto all_weights = f.all_gather(f.to_device(flat_state(*model).to(torch::kFloat)));
  for (size_t r = 1; r < all_steps.size(); ++r) {
    expect(torch::equal(all_steps[r].cpu(), all_steps[0].cpu()), f,
           "ranks 0 and " + std::to_string(r) + " skipped different steps");
    expect(torch::equal(all_weights[r].cpu(), all_weights[0].cpu()), f,
           "ranks 0 and " + std::to_string(r) + " end with different weights");
  }
  std::printf("rank %lld: stepped %s\n", static_cast<long long>(rank),
              torch::str(torch::tensor(stepped)).c_str());
}

struct BnNetImpl : torch::nn::Module {
  BnNetImpl() {
    torch::manual_seed(0);
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 3)));
    bn = register_module("bn", fabric::nn::BatchNorm2d(6));
    fc = register_module("fc", torch::nn::Linear(6 * 6 * 6, 5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc->forward(torch::relu(bn->forward(conv->forward(x))).flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  fabric::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(BnNet);

std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step) {
  torch::manual_seed(1000 + step);
  return {torch::randn({16, 3, 8, 8}) * 2 + 0.5, torch::randint(0, 5, {16})};
}

void syncbn(fabric::Fabric& f) {
  BnNet model;
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  f.setup(model, opt);
  const int64_t rank = f.global_rank(), world = f.world_size();
  const int64_t local = 16 / world;
  for (int64_t step = 0; step < 3; ++step) {
    auto [x, y] = global_batch(step);
    opt.zero_grad();
    auto out = model->forward(f.to_device(x.narrow(0, rank * local, local)));
    f.backward(torch::cross_entropy_loss(out, f.to_device(y.narrow(0, rank * local, local))));
    f.step(opt);
  }
  const torch::Tensor got = flat_state(*model);
  if (rank == 0) {
    BnNet ref;  // the same initial weights (seeded constructor), plain BatchNorm, whole batch
    ref->to(f.device());
    torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    for (int64_t step = 0; step < 3; ++step) {
      auto [x, y] = global_batch(step);
      ref_opt.zero_grad();
      torch::cross_entropy_loss(ref->forward(x.to(f.device())), y.to(f.device())).backward();
      ref_opt.step();
    }
    const torch::Tensor want = flat_state(*ref);
    expect(got.numel() == want.numel(), f, "SyncBatchNorm model and reference differ in size");
    if (got.numel() == want.numel()) {
      const double d = max_rel(got, want);
      std::printf(
          "rank 0: SyncBatchNorm over %lld ranks vs BatchNorm on the global batch: "
          "max_rel=%.3g\n",
          static_cast<long long>(world), d);
      expect(d < 1e-4, f, "SyncBatchNorm differs from BatchNorm on the global batch");
      const double moved = max_rel(want, flat_state(*BnNet()));
      expect(moved > 1e-3, f, "the reference did not train");
    }
  }
  const auto all = f.all_gather(f.to_device(got.to(torch::kFloat)));
  for (size_t r = 1; r < all.size(); ++r)
    expect(torch::equal(all[r].cpu(), all[0].cpu()), f, "ranks end with different weights");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  if (!torch::cuda::is_available()) return 77;
  const std::string mode = argv[1];
  std::vector<std::string> overrides = {"fabric.accelerator=cuda", "fabric.devices=1",
                                        "fabric.ddp.ranks_per_gpu=2", "fabric.strategy=ddp",
                                        "fabric.ddp.timeout_s=60"};
  if (mode == "overflow") overrides.push_back("fabric.precision=16-mixed");
  if (mode == "syncbn") {
    overrides.push_back("fabric.sync_batchnorm=true");
    overrides.push_back("fabric.precision=32-true");
    overrides.push_back("fabric.matmul_precision=highest");
    overrides.push_back("fabric.deterministic=true");
  }
  for (int i = 2; i < argc; ++i) overrides.push_back(argv[i]);
  return fabric::run_main(1, argv, fabric::training_schema(), [&](const fabric::Config&) {
    const auto config = fabric::Config::defaults(fabric::training_schema(), overrides);
    fabric::Fabric fabric(config);
    return fabric.launch([&](fabric::Fabric& f) {
      if (mode == "overflow") {
        overflow(f);
      } else if (mode == "syncbn") {
        syncbn(f);
      } else {
        expect(false, f, "unknown mode " + mode);
      }
      const double failures = f.all_reduce(static_cast<double>(g_failures), fabric::ReduceOp::kSum);
      return failures == 0 ? 0 : 1;
    });
  });
}
