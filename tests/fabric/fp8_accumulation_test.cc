// fp8-mixed through Fabric with gradient accumulation: the float8 weight casts kept between
// micro-batches (fabric/nn/fp8.h) give the weights a run that casts every micro-batch gives,
// bitwise, over several optimizer steps of fabric's fused AdamW (whose ATen kernel writes the
// weights without bumping their version counters: Fabric::step's release and the optimizer's
// bump must both see the change), while casting each weight once a step once the pattern is known.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <string>
#include <vector>

#include "fabric/connector.h"
#include "fabric/fabric.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/tensor_parallel.h"
#include "fabric/training/fast_optimizers.h"

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", fabric::nn::Linear(32, 64));
    b = register_module("b", fabric::nn::Linear(64, 32));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::relu(a(x))); }
  fabric::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

constexpr int kSteps = 4, kMicro = 3;

struct Trained {
  std::vector<torch::Tensor> weights;
  std::vector<int64_t> casts;  // weight casts in each optimizer step
};

Trained train(bool keep_casts) {
  fabric::nn::set_fp8_weight_cache(keep_casts);
  Trained run;
  fabric::Fabric fabric(
      fabric::Config::defaults(fabric::training_schema(), {"fabric.precision=fp8-mixed"}),
      fabric::MachineFacts());
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(5);
    Net model;
    fabric::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
    f.setup(model, optimizer);
    for (int s = 0; s < kSteps; ++s) {
      const int64_t before = fabric::nn::fp8_weight_casts();
      optimizer.zero_grad();
      for (int m = 0; m < kMicro; ++m) {
        const torch::Tensor x = torch::randn({48, 32});
        torch::Tensor loss;
        {
          auto guard = f.autocast();
          loss = model->forward(x).to(torch::kFloat).pow(2).mean();
        }
        f.backward(loss / kMicro);
      }
      f.step(optimizer);
      run.casts.push_back(fabric::nn::fp8_weight_casts() - before);
    }
    for (const auto& p : model->parameters()) run.weights.push_back(p.detach().clone());
  });
  fabric::nn::set_fp8_weight_cache(true);
  return run;
}

TEST(Fp8AccumulationTest, KeptWeightCastsTrainBitwiseAsCastsEveryMicroBatch) {
  const Trained kept = train(true), every = train(false);
  ASSERT_EQ(kept.weights.size(), every.weights.size());
  for (size_t i = 0; i < kept.weights.size(); ++i)
    EXPECT_TRUE(torch::equal(kept.weights[i], every.weights[i]))
        << "parameter " << i << ": max difference "
        << (kept.weights[i] - every.weights[i]).abs().max();
  // Two layers: 2 casts each step without the cache; with it 2 in the first step's second
  // micro-batch too (nothing known yet: the first casts, the second keeps), then 1 a step.
  EXPECT_EQ(every.casts, std::vector<int64_t>(kSteps, 2 * kMicro));
  EXPECT_EQ(kept.casts, (std::vector<int64_t>{4, 2, 2, 2}));
}

}  // namespace
