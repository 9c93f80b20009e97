// fabric::nn's float8 nodes of several layers against the layers' separate calls, on the CPU's
// _scaled_mm (where the casts run as ATen's ops; on CUDA their kernels compute the activations as
// they read: fp8_nodes_cuda_test): the GPT MLP (fp8_gelu_mlp), layers reading one input
// (fp8_linears) and the Llama MLP (fp8_swiglu_mlp). Products, gradients and delayed scaling's
// histories bitwise, tensorwise and delayed, with and without biases and bf16 autocast; and the
// fp8_layers.h entry points that take each node only for whole float8 layers of one recipe
// (a layer's input cast made by its producer: fp8_produced_test).
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/utils.h>

#include <optional>
#include <string>
#include <vector>

#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_layers.h"
#include "fabric/nn/tensor_parallel.h"
#include "fabric/precision/autocast.h"

namespace {

using fabric::nn::Fp8History;
using fabric::nn::Fp8Scaling;

bool all_equal(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!torch::equal(a[i], b[i])) return false;
  return true;
}

// A case's name in failure messages.
std::string case_name(Fp8Scaling scaling, bool biases, bool autocast, const std::string& more,
                      int step) {
  return "scaling " + std::to_string(static_cast<int>(scaling)) + (biases ? ", biases" : "") +
         (autocast ? ", autocast" : "") + more + ", step " + std::to_string(step);
}

// Each layer's delayed-scaling history (its amaxes and what is seeded) the other side's, bitwise.
void expect_same_histories(const std::vector<Fp8History>& a, const std::vector<Fp8History>& b,
                           const std::string& where) {
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].amax, b[i].amax)) << where << ", layer " << i;
    EXPECT_TRUE(torch::equal(a[i].seeded, b[i].seeded)) << where << ", layer " << i;
  }
}

// A GPT MLP as one float8 node (fp8_gelu_mlp: on CUDA the first layer's gradient cast computes the
// GELU's backward as it reads) against its two layers as fp8_linear calls: the product, the five
// gradients and both histories bitwise, tensorwise and delayed (two steps: the seed, then the
// histories' scales), with and without biases, and under bf16 autocast (a 16-bit hidden layer
// and gradient); gelu_tanh_mlp takes the node for two whole float8 layers of one recipe.
TEST(Fp8NodesTest, GeluMlpAsOneNodeIsItsTwoLinearsBitwise) {
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
          const std::string where = case_name(scaling, biases, autocast, "", step);
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
TEST(Fp8NodesTest, SharedInputLayersAreTheirSeparateCallsBitwise) {
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
            const std::string where =
                case_name(scaling, biases, autocast, all_used ? "" : ", k unused", step);
            ASSERT_EQ(one.size(), separate.size()) << where;
            EXPECT_EQ(one[0].scalar_type(), autocast ? c10::kBFloat16 : c10::kFloat) << where;
            EXPECT_TRUE(all_equal(one, separate)) << where;
            if (scaling == Fp8Scaling::kDelayed) expect_same_histories(fused, plain, where);
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

// A Llama MLP as one float8 node (fp8_swiglu_mlp: x cast once for gate and up, the SwiGLU
// computed by down's input cast, its backward by gate's and up's gradient casts on CUDA) against
// fp8_linears({gate, up}) → silu(g) · u → fp8_linear(down): the product, every gradient and
// history bitwise, tensorwise and delayed (two steps: the seed, then the histories' scales), with
// and without biases and bf16 autocast; with gate and up frozen and x without a gradient only
// down trains (gate's and up's histories as the separate layers leave them); swiglu_mlp takes
// the node for three whole float8 layers of one recipe only.
TEST(Fp8NodesTest, SwigluMlpAsOneNodeIsItsThreeLayersBitwise) {
  torch::manual_seed(9);
  const torch::Tensor x0 = torch::randn({2, 16, 32}), wg0 = torch::randn({96, 32}) * 0.2,
                      wu0 = torch::randn({96, 32}) * 0.2, wd0 = torch::randn({48, 96}) * 0.1,
                      bg0 = torch::randn({96}) * 0.5, bu0 = torch::randn({96}) * 0.5,
                      bd0 = torch::randn({48}), g0 = torch::randn({2, 16, 48});
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed})
    for (const bool biases : {true, false})
      for (const bool autocast : {false, true})
        for (const bool frozen : {false, true}) {
          std::vector<Fp8History> fused(3, Fp8History(4)), plain(3, Fp8History(4));
          for (auto* h : {&fused, &plain})  // (each its own seeded tensor)
            for (Fp8History& one : *h) one.seeded = one.seeded.clone();
          for (int step = 0; step < 2; ++step) {
            auto run = [&](bool one_node) {
              auto param = [&](const torch::Tensor& t, bool trains) {
                return trains ? t.clone().requires_grad_() : t.clone();
              };
              const torch::Tensor x = param(x0 * (1 + step), !frozen), wg = param(wg0, !frozen),
                                  wu = param(wu0, !frozen), wd = param(wd0, true),
                                  bg = biases ? param(bg0, !frozen) : torch::Tensor(),
                                  bu = biases ? param(bu0, !frozen) : torch::Tensor(),
                                  bd = biases ? param(bd0, true) : torch::Tensor();
              auto& h = one_node ? fused : plain;
              const fabric::nn::Fp8Layer gate{wg, bg, &h[0], true}, up{wu, bu, &h[1], true},
                  down{wd, bd, &h[2], true};
              torch::Tensor y;
              {
                std::optional<fabric::AutocastGuard> bf16;
                if (autocast) bf16.emplace(c10::DeviceType::CPU, c10::kBFloat16);
                if (one_node) {
                  y = fabric::nn::fp8_swiglu_mlp(x, gate, up, down, scaling);
                  EXPECT_NE(y.grad_fn()->name().find("Fp8SwigluMlp"), std::string::npos)
                      << y.grad_fn()->name();
                } else {
                  const auto gu = fabric::nn::fp8_linears(x, {gate, up}, scaling);
                  y = fabric::nn::fp8_linear(at::silu(gu[0]) * gu[1], wd, bd, scaling, &h[2]);
                }
              }
              y.backward(g0.to(y.scalar_type()));
              std::vector<torch::Tensor> out = {y.detach(), wd.grad()};
              if (biases) out.push_back(bd.grad());
              if (!frozen) out.insert(out.end(), {x.grad(), wg.grad(), wu.grad()});
              if (!frozen && biases) out.insert(out.end(), {bg.grad(), bu.grad()});
              return out;
            };
            const auto one = run(true), separate = run(false);
            const std::string where =
                case_name(scaling, biases, autocast, frozen ? ", gate and up frozen" : "", step);
            EXPECT_EQ(one[0].scalar_type(), autocast ? c10::kBFloat16 : c10::kFloat) << where;
            EXPECT_TRUE(all_equal(one, separate)) << where;
            if (scaling == Fp8Scaling::kDelayed) expect_same_histories(fused, plain, where);
          }
        }
  // Every weight frozen, x trains: no weight GEMM runs, and x's gradient is the one the node
  // gives when everything trains, bitwise.
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed}) {
    std::vector<torch::Tensor> x_grads;
    for (const bool weights_train : {true, false}) {
      std::vector<Fp8History> h(3, Fp8History(4));
      for (Fp8History& one : h) one.seeded = one.seeded.clone();
      const torch::Tensor x = x0.clone().requires_grad_();
      auto weight = [&](const torch::Tensor& w) { return w.clone().requires_grad_(weights_train); };
      const torch::Tensor y = fabric::nn::fp8_swiglu_mlp(x, {weight(wg0), {}, &h[0], true},
                                                         {weight(wu0), {}, &h[1], true},
                                                         {weight(wd0), {}, &h[2], true}, scaling);
      y.backward(g0);
      x_grads.push_back(x.grad());
    }
    EXPECT_TRUE(torch::equal(x_grads[0], x_grads[1])) << "scaling " << static_cast<int>(scaling);
  }
  fabric::nn::Linear gate(32, 96), up(32, 96), down(96, 48);
  auto swiglu = +[](const torch::Tensor& g, const torch::Tensor& u) { return at::silu(g) * u; };
  for (const Fp8Scaling scaling : {Fp8Scaling::kTensorwise, Fp8Scaling::kDelayed}) {
    for (auto* l : {&gate, &up, &down}) (*l)->set_fp8(true, scaling, 4);
    const torch::Tensor y = fabric::nn::swiglu_mlp(*gate, *up, *down, x0, swiglu);
    EXPECT_NE(y.grad_fn()->name().find("Fp8SwigluMlp"), std::string::npos) << y.grad_fn()->name();
    EXPECT_TRUE(torch::equal(y, down->forward(swiglu(gate->forward(x0), up->forward(x0)))));
  }
  down->set_fp8(false);  // one layer not in float8: the layers as written
  const torch::Tensor y = fabric::nn::swiglu_mlp(*gate, *up, *down, x0, swiglu);
  EXPECT_EQ(y.grad_fn()->name().find("Fp8SwigluMlp"), std::string::npos);
  EXPECT_TRUE(torch::equal(y, down->forward(swiglu(gate->forward(x0), up->forward(x0)))));
}

}  // namespace
