// fabric::nn float8 paths that must give another path's bits, on the CPU's float8 GEMM: delayed
// scaling's history, seeded by the first training pass (the tensorwise bits), read by later ones,
// advanced only by passes that train, so activation checkpointing's recomputation gives the
// plain module's gradients bitwise, and restored from a checkpoint to give the next step
// bitwise; the GELU fused into c_proj's cast against the unfused layer; delayed scaling without
// a history refused. (fp8_nodes_test: several layers as one node against their separate calls.)
#include <ATen/record_function.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_history.h"
#include "fabric/nn/tensor_parallel.h"
#include "fabric/precision/autocast.h"
#include "fabric/training/activation_checkpoint.h"

namespace {

using fabric::nn::Fp8History;
using fabric::nn::Fp8Scaling;

// y, x.grad, w.grad of one training pass of fp8_linear (a fixed weighting of y as the loss).
std::vector<torch::Tensor> train_pass(const torch::Tensor& x0, const torch::Tensor& w0,
                                      Fp8Scaling scaling, Fp8History* history) {
  torch::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  torch::Tensor y = fabric::nn::fp8_linear(x, w, torch::Tensor(), scaling, history);
  (y * torch::linspace(-1, 1, w0.size(0))).sum().backward();
  return {y.detach(), x.grad(), w.grad()};
}

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

TEST(Fp8Test, DelayedFirstTrainingPassIsTensorwiseAndSeedsTheHistory) {
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({32, 64}), w = torch::randn({48, 64}) * 0.1;
  Fp8History history(4);
  EXPECT_TRUE(all_equal(train_pass(x, w, Fp8Scaling::kDelayed, &history),
                        train_pass(x, w, Fp8Scaling::kTensorwise, nullptr)));
  // Each operand's amax at 0 (the seed) and 1 (its own, pushed), the record slot zeroed.
  const torch::Tensor want = torch::stack({x.abs().amax(), w.abs().amax()});
  EXPECT_TRUE(torch::equal(history.amax.slice(0, 0, 2).select(1, 0), want));
  EXPECT_TRUE(torch::equal(history.amax.slice(0, 0, 2).select(1, 1), want));
  EXPECT_EQ(history.amax.slice(1, 2).abs().sum().item<float>(), 0.f);
  EXPECT_GT(history.amax[2][0].item<float>(), 0.f);  // the output gradient's
  EXPECT_TRUE(history.seeded.all().item<bool>());
}

TEST(Fp8Test, DelayedScalesByTheHistorysLargestNotTheTensorsOwn) {
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({32, 64}), w = torch::randn({48, 64}) * 0.1;
  Fp8History history(4);
  train_pass(x, w, Fp8Scaling::kDelayed, &history);
  const float first = x.abs().amax().item<float>();
  // A smaller input next: its scale still comes from the first input's amax.
  const torch::Tensor x2 = x * 0.3;
  const auto delayed = train_pass(x2, w, Fp8Scaling::kDelayed, &history);
  const auto dynamic = train_pass(x2, w, Fp8Scaling::kTensorwise, nullptr);
  EXPECT_FALSE(torch::equal(delayed[0], dynamic[0]));
  auto dequantized = [](const torch::Tensor& t, float amax) {
    const torch::Tensor scale = 448.0 / torch::tensor(amax).clamp_min(1e-12);
    return (t * scale).clamp(-448, 448).to(torch::kFloat8_e4m3fn).to(torch::kFloat) / scale;
  };
  const torch::Tensor want =
      torch::matmul(dequantized(x2, first), dequantized(w, w.abs().amax().item<float>()).t());
  EXPECT_LT((delayed[0] - want).abs().max().item<float>(), 1e-4 * want.abs().max().item<float>());
  // The history now: x2's amax, then x's twice (the seed and its own).
  EXPECT_TRUE(torch::allclose(history.amax[0].slice(0, 0, 3),
                              torch::tensor({0.3f * first, first, first}), 1e-6, 0));
}

TEST(Fp8Test, DelayedHistoryAdvancesOnlyInPassesThatTrain) {
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({32, 64}), w = torch::randn({48, 64}) * 0.1;
  Fp8History history(4);
  {
    torch::NoGradGuard off;  // before any training pass: dynamic, nothing recorded
    EXPECT_TRUE(torch::equal(fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kDelayed, &history),
                             fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kTensorwise)));
  }
  EXPECT_FALSE(history.seeded.any().item<bool>());
  EXPECT_EQ(history.amax.abs().sum().item<float>(), 0.f);
  train_pass(x, w, Fp8Scaling::kDelayed, &history);
  const torch::Tensor before = history.amax.clone();
  {
    torch::NoGradGuard off;  // evaluation: reads the history, does not advance it
    fabric::nn::fp8_linear(x * 3, w, {}, Fp8Scaling::kDelayed, &history);
  }
  // Gradients on but nothing requires one: no backward will run, so no record either.
  fabric::nn::fp8_linear(x * 3, w, {}, Fp8Scaling::kDelayed, &history);
  EXPECT_TRUE(torch::equal(history.amax, before));
}

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", fabric::nn::Linear(64, 128));
    fc2 = register_module("fc2", fabric::nn::Linear(128, 32));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  fabric::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Mlp);

TEST(Fp8Test, DelayedUnderActivationCheckpointingGivesThePlainGradientsBitwise) {
  torch::manual_seed(4);
  Mlp plain, checkpointed;
  {
    torch::NoGradGuard off;
    for (size_t i = 0; i < plain->parameters().size(); ++i)
      checkpointed->parameters()[i].copy_(plain->parameters()[i]);
  }
  fabric::nn::convert_to_fp8(*plain, {}, Fp8Scaling::kDelayed, 3);
  fabric::nn::convert_to_fp8(*checkpointed, {}, Fp8Scaling::kDelayed, 3);
  // Three steps: the seed, then scales from the history (the inputs grow, so they differ).
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor x = torch::randn({32, 64}) * (1 + step);
    plain->zero_grad();
    checkpointed->zero_grad();
    plain->forward(x).pow(2).sum().backward();
    fabric::checkpoint_activations(checkpointed, x).pow(2).sum().backward();
    for (size_t i = 0; i < plain->parameters().size(); ++i)
      EXPECT_TRUE(torch::equal(plain->parameters()[i].grad(), checkpointed->parameters()[i].grad()))
          << "step " << step << ", parameter " << i;
    EXPECT_TRUE(
        torch::equal(plain->fc1->fp8_history()->amax, checkpointed->fc1->fp8_history()->amax))
        << "step " << step;
  }
  // A clone has a fresh history of the same length.
  auto copy = std::dynamic_pointer_cast<fabric::nn::LinearImpl>(plain->fc1->clone());
  ASSERT_TRUE(copy->fp8_history().has_value());
  EXPECT_EQ(copy->fp8_history()->length, 3);
  EXPECT_FALSE(copy->fp8_history()->amax.defined());
}

void copy_parameters(Mlp& from, Mlp& to) {
  torch::NoGradGuard off;
  for (size_t i = 0; i < from->parameters().size(); ++i)
    to->parameters()[i].copy_(from->parameters()[i]);
}

// One training step of `m` on x; returns its gradients.
std::vector<torch::Tensor> mlp_step(Mlp& m, const torch::Tensor& x) {
  m->zero_grad();
  m->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : m->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

// Delayed scaling's histories through a checkpoint (fp8_history.h; Fabric::save keeps each
// rank's): packed, read back as the file keeps them and restored into a model with the same
// weights, its next step's gradients are bitwise those of the model that kept its own (a fresh
// history seeds from the step's own amaxes: other gradients); another history length is refused
// naming the layer and both lengths; a layer the file lacks starts afresh.
TEST(Fp8Test, DelayedHistoriesRestoredGiveTheNextStepBitwise) {
  torch::manual_seed(5);
  Mlp kept, restored, fresh;
  for (Mlp* m : {&kept, &restored, &fresh})
    fabric::nn::convert_to_fp8(**m, {}, Fp8Scaling::kDelayed, 3);
  for (int step = 0; step < 2; ++step) mlp_step(kept, torch::randn({32, 64}) * (2 + step));
  copy_parameters(kept, restored);
  copy_parameters(kept, fresh);
  const fabric::nn::NamedModules saved_from = {{"model", kept.get()}};
  const fabric::nn::Fp8HistoryPack pack = fabric::nn::pack_fp8_histories(saved_from);
  EXPECT_EQ(pack.names, "model/fc1 3\nmodel/fc2 3\n");
  const auto saved = fabric::nn::fp8_histories_dict(pack.values, pack.names);
  std::string why;
  const auto apply = fabric::nn::restore_fp8_histories(saved, {{"model", restored.get()}}, &why);
  ASSERT_TRUE(apply) << why;
  apply();
  EXPECT_TRUE(torch::equal(restored->fc2->fp8_history()->amax, kept->fc2->fp8_history()->amax));
  const torch::Tensor x = torch::randn({32, 64}) * 0.5;  // smaller: the history's scale differs
  const auto want = mlp_step(kept, x), got = mlp_step(restored, x), other = mlp_step(fresh, x);
  EXPECT_TRUE(all_equal(want, got));
  EXPECT_FALSE(all_equal(want, other)) << "the histories changed nothing";

  Mlp longer;
  fabric::nn::convert_to_fp8(*longer, {}, Fp8Scaling::kDelayed, 4);
  EXPECT_FALSE(fabric::nn::restore_fp8_histories(saved, {{"model", longer.get()}}, &why));
  EXPECT_EQ(why, "model/fc1: 3 steps saved, fabric.fp8.amax_history is 4");
  EXPECT_FALSE(fabric::nn::restore_fp8_histories(saved, {{"net", restored.get()}}, &why));
  EXPECT_EQ(why, "saved for a layer this model lacks (model/fc1)");

  auto only_fc1 = saved.copy();
  ASSERT_EQ(only_fc1.erase("model/fc2"), 1u);
  const auto partial =
      fabric::nn::restore_fp8_histories(only_fc1, {{"model", restored.get()}}, &why);
  ASSERT_TRUE(partial) << why;
  partial();
  EXPECT_EQ(restored->fc2->fp8_history()->amax.abs().sum().item<float>(), 0.f);
  EXPECT_FALSE(restored->fc2->fp8_history()->seeded.any().item<bool>());
  EXPECT_TRUE(restored->fc1->fp8_history()->seeded.all().item<bool>());
}

// A GPT MLP's second layer: linear(gelu_tanh(h)) with the GELU inside fp8_linear (fused into the
// cast on CUDA; here torch::gelu first) gives gelu-then-fp8_linear's product and gradients bitwise,
// tensorwise and delayed; LinearImpl::forward_gelu_tanh takes that path when the layer is float8
// and is forward(gelu(x)) otherwise.
TEST(Fp8Test, GeluInputIsGeluThenLinearBitwise) {
  torch::manual_seed(5);
  const torch::Tensor h0 = torch::randn({32, 128}), w0 = torch::randn({48, 128}) * 0.1,
                      b0 = torch::randn({48});
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed}) {
    Fp8History fused_history(4), plain_history(4);
    for (int step = 0; step < 2; ++step) {  // delayed: the seed, then the history's scale
      auto run = [&](bool fused) {
        torch::Tensor h = (h0 * (1 + step)).requires_grad_(), w = w0.clone().requires_grad_(),
                      b = b0.clone().requires_grad_();
        Fp8History* history = fused ? &fused_history : &plain_history;
        const torch::Tensor y =
            fused ? fabric::nn::fp8_linear(h, w, b, scaling, history, /*gelu_tanh_input=*/true)
                  : fabric::nn::fp8_linear(torch::gelu(h, "tanh"), w, b, scaling, history);
        (y * torch::linspace(-1, 1, 48)).sum().backward();
        return std::vector<torch::Tensor>{y.detach(), h.grad(), w.grad(), b.grad()};
      };
      EXPECT_TRUE(all_equal(run(true), run(false)))
          << "scaling " << static_cast<int>(scaling) << ", step " << step;
    }
  }
  fabric::nn::Linear layer(128, 48);
  const torch::Tensor plain = layer->forward(torch::gelu(h0, "tanh"));
  EXPECT_TRUE(torch::equal(layer->forward_gelu_tanh(h0), plain));  // not float8: as written
  layer->set_fp8(true);
  EXPECT_TRUE(
      torch::equal(layer->forward_gelu_tanh(h0),
                   fabric::nn::fp8_linear(torch::gelu(h0, "tanh"), layer->weight, layer->bias)));
}

std::atomic<int> g_scaled_mms{0};

// Counts the float8 GEMMs (fabric::fp8_gemm, the scope fp8_gemm.cc records around each) made
// while it lives: a thread-local RecordFunction callback, which the autograd engine's threads
// inherit.
struct ScaledMmCount {
  at::CallbackHandle handle;
  ScaledMmCount() {
    g_scaled_mms = 0;
    handle = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                       -> std::unique_ptr<at::ObserverContext> {
          if (std::strcmp(fn.name(), "fabric::fp8_gemm") == 0) ++g_scaled_mms;
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
  }
  ~ScaledMmCount() { at::removeCallback(handle); }
};

// A frozen weight's gradient GEMM is not run, nor the input's where it needs no gradient (one
// float8 GEMM in backward instead of two): the other gradients, the product and delayed
// scaling's history are bitwise those of the pass where everything trains (the output gradient
// is still cast and recorded), tensorwise and delayed.
TEST(Fp8Test, WhatNeedsNoGradientIsNotComputedAndTheRestIsUnchanged) {
  torch::manual_seed(11);
  const torch::Tensor x0 = torch::randn({32, 64}), w0 = torch::randn({48, 64}) * 0.1,
                      b0 = torch::randn({48}), g0 = torch::randn({32, 48});
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed}) {
    Fp8History all(4), frozen_w(4), plain_x(4);
    for (int step = 0; step < 2; ++step) {
      auto run = [&](bool x_trains, bool w_trains, Fp8History* history) {
        const torch::Tensor x = x0.clone().requires_grad_(x_trains),
                            w = w0.clone().requires_grad_(w_trains),
                            b = b0.clone().requires_grad_();
        const torch::Tensor y = fabric::nn::fp8_linear(x, w, b, scaling, history);
        const ScaledMmCount count;
        y.backward(g0);
        EXPECT_EQ(g_scaled_mms.load(), int{x_trains} + int{w_trains}) << x_trains << w_trains;
        return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad(), b.grad()};
      };
      const auto a = run(true, true, &all), f = run(true, false, &frozen_w),
                 p = run(false, true, &plain_x);
      const std::string where =
          "scaling " + std::to_string(static_cast<int>(scaling)) + ", step " + std::to_string(step);
      EXPECT_FALSE(f[2].defined()) << where;
      EXPECT_FALSE(p[1].defined()) << where;
      EXPECT_TRUE(all_equal({a[0], a[1], a[3]}, {f[0], f[1], f[3]})) << "frozen weight, " << where;
      EXPECT_TRUE(all_equal({a[0], a[2], a[3]}, {p[0], p[2], p[3]})) << "plain input, " << where;
      if (scaling == Fp8Scaling::kDelayed) {
        EXPECT_TRUE(torch::equal(all.amax, frozen_w.amax)) << where;
        EXPECT_TRUE(torch::equal(all.amax, plain_x.amax)) << where;
      }
    }
  }
}

TEST(Fp8Test, DelayedWithoutAHistoryIsRefused) {
  try {
    fabric::nn::fp8_linear(torch::randn({16, 64}), torch::randn({32, 64}), {},
                           Fp8Scaling::kDelayed);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_STREQ(e.what(), "fp8_linear: fabric.fp8.recipe: delayed needs the layer's Fp8History");
  }
}

}  // namespace
