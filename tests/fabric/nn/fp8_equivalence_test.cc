// fabric::nn float8 paths that must give another path's bits, on the CPU's _scaled_mm: delayed
// scaling's history, seeded by the first training pass (the tensorwise bits), read by later ones,
// advanced only by passes that train, so activation checkpointing's recomputation gives the
// plain module's gradients bitwise, and restored from a checkpoint to give the next step
// bitwise; the GELU fused into c_proj's cast and the GPT MLP as one node against the unfused
// layers; layers sharing one input cast against their separate calls; delayed scaling without a
// history refused.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/module.h>
#include <torch/utils.h>

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

// A GPT MLP as one float8 node (fp8_gelu_mlp: on CUDA the first layer's gradient cast computes the
// GELU's backward as it reads) against its two layers as fp8_linear calls: the product, the five
// gradients and both histories bitwise, tensorwise and delayed (two steps: the seed, then the
// histories' scales), with and without biases, and under bf16 autocast (a 16-bit hidden layer
// and gradient); gelu_tanh_mlp takes the node for two whole float8 layers of one recipe.
TEST(Fp8Test, GeluMlpAsOneNodeIsItsTwoLinearsBitwise) {
  torch::manual_seed(7);
  const torch::Tensor x0 = torch::randn({2, 16, 32}), w10 = torch::randn({128, 32}) * 0.2,
                      b10 = torch::randn({128}) * 0.5, w20 = torch::randn({48, 128}) * 0.1,
                      b20 = torch::randn({48}), g0 = torch::randn({2, 16, 48});
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed})
    for (const bool biases : {true, false})
      for (const bool autocast : {false, true}) {
        Fp8History fused1(4), fused2(4), plain1(4), plain2(4);
        for (int step = 0; step < 2; ++step) {
          auto run = [&](bool fused) {
            torch::Tensor x = (x0 * (1 + step)).requires_grad_(), w1 = w10.clone().requires_grad_(),
                          w2 = w20.clone().requires_grad_(),
                          b1 = biases ? b10.clone().requires_grad_() : torch::Tensor(),
                          b2 = biases ? b20.clone().requires_grad_() : torch::Tensor();
            torch::Tensor y;
            {
              std::optional<fabric::AutocastGuard> bf16;
              if (autocast) bf16.emplace(c10::DeviceType::CPU, c10::kBFloat16);
              y = fused
                      ? fabric::nn::fp8_gelu_mlp(x, w1, b1, w2, b2, scaling, &fused1, &fused2)
                      : fabric::nn::fp8_linear(fabric::nn::fp8_linear(x, w1, b1, scaling, &plain1),
                                               w2, b2, scaling, &plain2, /*gelu_tanh_input=*/true);
            }
            y.backward(g0.to(y.scalar_type()));
            std::vector<torch::Tensor> out = {y.detach(), x.grad(), w1.grad(), w2.grad()};
            if (biases) out.insert(out.end(), {b1.grad(), b2.grad()});
            return out;
          };
          const auto fused = run(true), plain = run(false);
          const std::string where = "scaling " + std::to_string(static_cast<int>(scaling)) +
                                    (biases ? ", biases" : "") + (autocast ? ", autocast" : "") +
                                    ", step " + std::to_string(step);
          EXPECT_EQ(fused[0].scalar_type(), autocast ? c10::kBFloat16 : c10::kFloat) << where;
          EXPECT_TRUE(all_equal(fused, plain)) << where;
          if (scaling == Fp8Scaling::kDelayed) {
            EXPECT_TRUE(torch::equal(fused1.amax, plain1.amax) &&
                        torch::equal(fused2.amax, plain2.amax))
                << where;
          }
        }
      }
  // c_fc frozen and x without a gradient: the first layer's backward does not run, so its
  // history is the two layers' (where the first had no node) and only c_proj trains.
  {
    Fp8History fused1(4), fused2(4), plain1(4), plain2(4);
    for (int step = 0; step < 2; ++step) {
      auto run = [&](bool fused) {
        torch::Tensor w2 = w20.clone().requires_grad_(), b2 = b20.clone().requires_grad_();
        const torch::Tensor y =
            fused ? fabric::nn::fp8_gelu_mlp(x0, w10, b10, w2, b2, Fp8Scaling::kDelayed, &fused1,
                                             &fused2)
                  : fabric::nn::fp8_linear(
                        fabric::nn::fp8_linear(x0, w10, b10, Fp8Scaling::kDelayed, &plain1), w2, b2,
                        Fp8Scaling::kDelayed, &plain2, /*gelu_tanh_input=*/true);
        y.backward(g0);
        return std::vector<torch::Tensor>{y.detach(), w2.grad(), b2.grad()};
      };
      EXPECT_TRUE(all_equal(run(true), run(false))) << "frozen c_fc, step " << step;
      EXPECT_TRUE(torch::equal(fused1.amax, plain1.amax) && torch::equal(fused2.amax, plain2.amax))
          << "frozen c_fc, step " << step;
      EXPECT_TRUE(torch::equal(fused1.seeded, plain1.seeded)) << "frozen c_fc, step " << step;
    }
  }
  fabric::nn::Linear fc(32, 128), proj(128, 48);
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed}) {
    fc->set_fp8(true, scaling, 4);
    proj->set_fp8(true, scaling, 4);
    const torch::Tensor y = fabric::nn::gelu_tanh_mlp(*fc, *proj, x0);
    EXPECT_NE(y.grad_fn()->name().find("Fp8GeluMlp"), std::string::npos) << y.grad_fn()->name();
    EXPECT_TRUE(torch::equal(y, proj->forward_gelu_tanh(fc->forward(x0))));
  }
  proj->set_fp8(false);  // one layer in float8: as written
  EXPECT_TRUE(torch::equal(fabric::nn::gelu_tanh_mlp(*fc, *proj, x0),
                           proj->forward(torch::gelu(fc->forward(x0), "tanh"))));
}

// Layers reading one input as one float8 node (fp8_linears: the input quantized once) against
// their separate fp8_linear calls: the products, the weight and bias gradients and every history
// bitwise, the input's gradient the separate calls' summed as autograd sums them, tensorwise and
// delayed (two steps), with and without biases and bf16 autocast; an output nothing uses leaves
// its layer untouched (no gradient, history as its own layer's); shared_input_forward takes the
// node for whole float8 layers of one recipe only.
TEST(Fp8Test, SharedInputLayersAreTheirSeparateCallsBitwise) {
  torch::manual_seed(8);
  const torch::Tensor x0 = torch::randn({2, 16, 32});
  const std::vector<int64_t> outs = {64, 32, 32};  // q, k, v of a grouped-query attention
  std::vector<torch::Tensor> w0, b0, g0;
  for (const int64_t n : outs) {
    w0.push_back(torch::randn({n, 32}) * 0.2);
    b0.push_back(torch::randn({n}) * 0.5);
    g0.push_back(torch::randn({2, 16, n}));
  }
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed})
    for (const bool biases : {true, false})
      for (const bool autocast : {false, true})
        for (const bool all_used : {true, false}) {
          std::vector<Fp8History> fused, plain;  // (each its own tensors)
          for (int i = 0; i < 3; ++i) {
            fused.emplace_back(4);
            plain.emplace_back(4);
          }
          for (int step = 0; step < 2; ++step) {
            // {ys..., w grads..., b grads..., x grad}; the separate calls' x grad summed in order.
            auto run = [&](bool one_node) {
              std::vector<torch::Tensor> w, b, xs;
              for (size_t i = 0; i < 3; ++i) {
                w.push_back(w0[i].clone().requires_grad_());
                b.push_back(biases ? b0[i].clone().requires_grad_() : torch::Tensor());
                xs.push_back((x0 * (1 + step)).requires_grad_());
              }
              std::vector<torch::Tensor> ys;
              {
                std::optional<fabric::AutocastGuard> bf16;
                if (autocast) bf16.emplace(c10::DeviceType::CPU, c10::kBFloat16);
                if (one_node) {
                  std::vector<fabric::nn::Fp8Layer> layers;
                  for (size_t i = 0; i < 3; ++i) layers.push_back({w[i], b[i], &fused[i], true});
                  ys = fabric::nn::fp8_linears(xs[0], layers, scaling);
                } else {
                  for (size_t i = 0; i < 3; ++i)
                    ys.push_back(fabric::nn::fp8_linear(xs[i], w[i], b[i], scaling, &plain[i]));
                }
              }
              torch::Tensor loss = torch::zeros({});
              for (size_t i = 0; i < 3; ++i)
                if (all_used || i != 1) loss = loss + (ys[i].to(torch::kFloat) * g0[i]).sum();
              loss.backward();
              std::vector<torch::Tensor> out;
              for (const auto& y : ys) out.push_back(y.detach());
              for (size_t i = 0; i < 3; ++i) {
                if (!all_used && i == 1) {
                  EXPECT_FALSE(w[i].grad().defined());
                  continue;
                }
                out.push_back(w[i].grad());
                if (biases) out.push_back(b[i].grad());
              }
              // As autograd sums separate layers' (the last layer's first).
              torch::Tensor gx = xs[0].grad();
              if (!one_node) {
                gx = xs[2].grad();
                if (xs[1].grad().defined()) gx = xs[1].grad() + gx;
                gx = xs[0].grad() + gx;
              }
              out.push_back(gx);
              return out;
            };
            const auto one = run(true), separate = run(false);
            const std::string where = "scaling " + std::to_string(static_cast<int>(scaling)) +
                                      (biases ? ", biases" : "") + (autocast ? ", autocast" : "") +
                                      (all_used ? "" : ", k unused") + ", step " +
                                      std::to_string(step);
            ASSERT_EQ(one.size(), separate.size()) << where;
            EXPECT_EQ(one[0].scalar_type(), autocast ? c10::kBFloat16 : c10::kFloat) << where;
            EXPECT_TRUE(all_equal(one, separate)) << where;
            if (scaling == Fp8Scaling::kDelayed)
              for (size_t i = 0; i < 3; ++i) {
                EXPECT_TRUE(torch::equal(fused[i].amax, plain[i].amax)) << where << ", layer " << i;
                EXPECT_TRUE(torch::equal(fused[i].seeded, plain[i].seeded))
                    << where << ", layer " << i;
              }
          }
        }
  std::vector<fabric::nn::Linear> layers;
  for (const int64_t n : outs) layers.emplace_back(32, n);
  const std::vector<fabric::nn::LinearImpl*> raw = {layers[0].get(), layers[1].get(),
                                                    layers[2].get()};
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed}) {
    for (auto& l : layers) l->set_fp8(true, scaling, 4);
    const auto ys = fabric::nn::shared_input_forward(raw, x0);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_NE(ys[i].grad_fn()->name().find("Fp8SharedInput"), std::string::npos)
          << ys[i].grad_fn()->name();
      EXPECT_TRUE(torch::equal(ys[i], layers[i]->forward(x0)));
    }
  }
  layers[2]->set_fp8(false);  // one layer not in float8: each layer's forward
  const auto ys = fabric::nn::shared_input_forward(raw, x0);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(ys[i].grad_fn()->name().find("Fp8SharedInput"), std::string::npos);
    EXPECT_TRUE(torch::equal(ys[i], layers[i]->forward(x0)));
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
