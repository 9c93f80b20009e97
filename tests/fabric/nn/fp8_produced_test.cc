// A float8 layer's input cast made by the kernel that writes the input (its producer, a norm)
// against the layer casting that input itself, on the CPU, where the producer is
// fabric::nn::fp8_input_from after a LayerNorm (the path without a kernel that writes float8; on
// CUDA the fused norms write it: fused_models_cuda_test): one layer (produced_forward), the GPT
// MLP (gelu_tanh_mlp), layers sharing one input (shared_input_forward: a Llama's q, k and v) and
// the Llama MLP (swiglu_mlp: gate and up share it); and a made cast that does not fit is refused.
#include <ATen/ops/silu.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <optional>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/fp8.h"
#include "fabric/nn/fp8_layers.h"
#include "fabric/nn/tensor_parallel.h"
#include "fabric/precision/autocast.h"

namespace {

using fabric::nn::Fp8History;
using fabric::nn::Fp8Scaling;
using fabric::nn::Linear;

enum class Mode { kLinear, kGeluMlp, kQkv, kSwigluMlp };

// A mode's name in failure messages, and the node that reads its made cast.
struct ModeNames {
  const char* name;
  const char* node;
};
ModeNames names(Mode m) {
  static const ModeNames kNames[] = {{"Linear", "Fp8Linear"},
                                     {"GELU MLP", "Fp8GeluMlp"},
                                     {"q, k, v", "Fp8SharedInput"},
                                     {"SwiGLU MLP", "Fp8SwigluMlp"}};
  return kNames[static_cast<int>(m)];
}

torch::Tensor swiglu(const torch::Tensor& g, const torch::Tensor& u) { return at::silu(g) * u; }

// A LayerNorm (width 32) and the layers reading its output: a (32 → 64); GELU MLP: b (64 → 32);
// q, k, v: b, c (32 → 32); SwiGLU: b (32 → 64, up), c (64 → 32, down). Delayed scaling, histories
// of 4. The same weights for every call (seeded).
struct Net {
  explicit Net(Mode mode, Fp8Scaling scaling = Fp8Scaling::kDelayed) : mode(mode) {
    torch::manual_seed(3);
    ln = torch::nn::LayerNorm(torch::nn::LayerNormOptions({32}));
    {
      torch::NoGradGuard no_grad;
      ln->weight.uniform_(0.5, 1.5);
      ln->bias.uniform_(-0.2, 0.2);
    }
    a = Linear(32, 64);
    b = mode == Mode::kGeluMlp ? Linear(64, 32)
        : mode == Mode::kQkv   ? Linear(32, 32)
                               : Linear(32, 64);
    c = mode == Mode::kSwigluMlp ? Linear(64, 32) : Linear(32, 32);
    for (auto* l : layers()) l->set_fp8(true, scaling, 4);
  }
  std::vector<fabric::nn::LinearImpl*> layers() {
    switch (mode) {
      case Mode::kLinear:
        return {a.get()};
      case Mode::kGeluMlp:
        return {a.get(), b.get()};
      default:
        return {a.get(), b.get(), c.get()};
    }
  }
  std::vector<torch::Tensor> params() {
    std::vector<torch::Tensor> p = {ln->weight, ln->bias};
    for (auto* l : layers()) p.insert(p.end(), {l->weight, l->bias});
    return p;
  }
  // The layers on an input the producer writes (produce) or on y, cast by the layers themselves.
  torch::Tensor produced(const torch::Tensor& like, const fabric::nn::Fp8Producer& produce) {
    switch (mode) {
      case Mode::kLinear:
        return fabric::nn::produced_forward(*a, like, produce);
      case Mode::kGeluMlp:
        return fabric::nn::gelu_tanh_mlp(*a, *b, like, produce);
      case Mode::kQkv:
        return torch::cat(
            fabric::nn::shared_input_forward({a.get(), b.get(), c.get()}, like, produce), -1);
      case Mode::kSwigluMlp:
        return fabric::nn::swiglu_mlp(*a, *b, *c, like, produce, swiglu);
    }
    return {};
  }
  torch::Tensor own(const torch::Tensor& y) {
    switch (mode) {
      case Mode::kLinear:
        return a->forward(y);
      case Mode::kGeluMlp:
        return fabric::nn::gelu_tanh_mlp(*a, *b, y);
      case Mode::kQkv:
        return torch::cat(fabric::nn::shared_input_forward({a.get(), b.get(), c.get()}, y), -1);
      case Mode::kSwigluMlp:
        return fabric::nn::swiglu_mlp(*a, *b, *c, y, swiglu);
    }
    return {};
  }
  Mode mode;
  torch::nn::LayerNorm ln{nullptr};
  Linear a{nullptr}, b{nullptr}, c{nullptr};
};

// Products, every gradient (the input's through the stand-in and the LayerNorm) and the delayed
// histories bitwise over five passes: the seeding pass (no cast handed out), a training pass, an
// evaluation without gradients (the history only read), a pass with gradients on but nothing to
// train (the record taken, then cleared), and a training pass after two SGD steps; with and
// without bf16 autocast. A cast must be handed out exactly on the four passes after the seed, and
// the layers' own node must read it (not their separate calls). Under tensorwise scaling the same
// with an amax handed out on every pass (the CPU's cast reads it as the CUDA kernels do).
TEST(Fp8ProducedTest, ProducedInputIsTheLayersOwnCastBitwise) {
  torch::manual_seed(11);
  const torch::Tensor x0 = torch::randn({2, 16, 32}) * 2 + 0.5;
  for (const Fp8Scaling scaling : {Fp8Scaling::kDelayed, Fp8Scaling::kTensorwise})
    for (const Mode mode : {Mode::kLinear, Mode::kGeluMlp, Mode::kQkv, Mode::kSwigluMlp})
      for (const bool autocast : {false, true}) {
        const bool delayed = scaling == Fp8Scaling::kDelayed;
        Net na(mode, scaling), nb(mode, scaling);
        int handed = 0;
        for (int pass = 0; pass < 5; ++pass) {
          const bool eval = pass == 2, frozen = pass == 3;
          const std::string where =
              std::string(names(mode).name) + (delayed ? "" : ", tensorwise") +
              (autocast ? ", autocast" : "") + ", pass " + std::to_string(pass);
          auto run = [&](bool produced, Net& net) {
            std::vector<torch::Tensor> params = net.params();
            for (auto& p : params) p.requires_grad_(!frozen);
            torch::Tensor x = (x0 * (1 + 0.25 * pass)).requires_grad_(!frozen);
            torch::Tensor y;
            {
              std::optional<torch::NoGradGuard> no_grad;
              if (eval) no_grad.emplace();
              std::optional<fabric::AutocastGuard> bf16;
              if (autocast) bf16.emplace(c10::DeviceType::CPU, c10::kBFloat16);
              auto produce = [&](fabric::nn::Fp8InputCast* cast) {
                const torch::Tensor normed = net.ln->forward(x);
                if (cast == nullptr) return normed;
                ++handed;
                return fabric::nn::fp8_input_from(normed, *cast);
              };
              y = produced ? net.produced(x, produce) : net.own(net.ln->forward(x));
            }
            if (produced && (pass > 0 || !delayed) && !eval && !frozen) {
              // (q, k, v: cat's node first; the shared node is its input's)
              const auto& fn =
                  mode == Mode::kQkv ? y.grad_fn()->next_edges()[0].function : y.grad_fn();
              EXPECT_NE(fn->name().find(names(mode).node), std::string::npos)
                  << where << ": " << fn->name();
            }
            std::vector<torch::Tensor> out = {y.detach()};
            if (!eval && !frozen) {
              y.backward(torch::ones_like(y) * 0.5 + y.detach() * 0.1);
              out.push_back(x.grad());
              for (auto& p : params)
                if (p.grad().defined()) out.push_back(p.grad());
              torch::NoGradGuard no_grad;
              for (auto& p : params)
                if (p.grad().defined()) p.sub_(p.grad() * 0.05), p.mutable_grad().reset();
            }
            for (auto& p : params) p.requires_grad_(true);
            return out;
          };
          const int before = handed;
          const auto a = run(true, na);
          const auto b = run(false, nb);
          EXPECT_EQ(handed - before, pass == 0 && delayed ? 0 : 1)
              << where << ": casts handed to the norm";
          ASSERT_EQ(a.size(), b.size()) << where;
          for (size_t i = 0; i < a.size(); ++i)
            EXPECT_TRUE(torch::equal(a[i], b[i])) << where << ", tensor " << i;
          const auto la = na.layers(), lb = nb.layers();
          for (size_t i = 0; i < la.size() && delayed; ++i) {
            EXPECT_TRUE(torch::equal(la[i]->fp8_history()->amax, lb[i]->fp8_history()->amax))
                << where << ", layer " << i;
            EXPECT_TRUE(torch::equal(la[i]->fp8_history()->seeded, lb[i]->fp8_history()->seeded))
                << where << ", layer " << i;
          }
        }
      }
}

// Layers that cannot share one made cast are handed none: q, k and v with v tensorwise and the
// others delayed, with one layer outside float8, or with one layer's fast_accumulation off read
// their input as written, with the values of a twin that never had a producer (two passes: the
// seed, then the one a cast would be handed on).
TEST(Fp8ProducedTest, LayersThatCannotShareACastAreHandedNone) {
  const torch::Tensor x = torch::randn({2, 16, 32});
  for (const int variant : {0, 1, 2}) {
    Net na(Mode::kQkv), nb(Mode::kQkv);
    for (Net* n : {&na, &nb}) {
      if (variant == 0)
        n->c->set_fp8(true, Fp8Scaling::kTensorwise);
      else if (variant == 1)
        n->c->set_fp8(false);
      else
        n->c->set_fp8(true, Fp8Scaling::kDelayed, 4, /*fast_accumulation=*/false);
    }
    int handed = 0;
    for (int pass = 0; pass < 2; ++pass) {
      const auto ys =
          fabric::nn::shared_input_forward(na.layers(), x, [&](fabric::nn::Fp8InputCast* cast) {
            if (cast != nullptr) ++handed;
            return na.ln->forward(x);
          });
      EXPECT_TRUE(torch::equal(torch::cat(ys, -1), nb.own(nb.ln->forward(x))))
          << "variant " << variant << ", pass " << pass;
    }
    EXPECT_EQ(handed, 0) << "variant " << variant;
  }
}

// Under tensorwise scaling the layers' cast reads the amax their producer took, not one of its
// own: a producer that reports 1.5 times its output's amax shrinks the scale by a factor that is
// not a power of two (one would only move the exponents), which changes the rounding and so the
// output (one layer, layers sharing the input, the SwiGLU MLP).
TEST(Fp8ProducedTest, ATensorwiseCastReadsTheAmaxItsProducerTook) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({2, 16, 32}) * 2;
  for (const Mode mode : {Mode::kLinear, Mode::kQkv, Mode::kSwigluMlp}) {
    Net n(mode, Fp8Scaling::kTensorwise);
    for (const double factor : {1.0, 1.5}) {
      const torch::Tensor y = n.produced(x, [&](fabric::nn::Fp8InputCast* cast) {
        const torch::Tensor normed = n.ln->forward(x);
        if (cast == nullptr) return normed;
        const torch::Tensor out = fabric::nn::fp8_input_from(normed, *cast);
        cast->amax.mul_(factor);
        return out;
      });
      EXPECT_EQ(torch::equal(y, n.own(n.ln->forward(x))), factor == 1.0)
          << names(mode).name << ", amax x " << factor;
    }
  }
}

// A made cast of the wrong size, or handed to a recipe that cannot take one, is refused; so is a
// shared one for layers whose input history is not seeded, or that are not delayed; an amax alone
// only for tensorwise layers reading their input itself.
TEST(Fp8ProducedTest, AMadeCastThatDoesNotFitIsRefused) {
  const torch::Tensor x = torch::randn({16, 32}), w = torch::randn({48, 32});
  Fp8History h(4);
  fabric::nn::Fp8Input wrong{torch::zeros({16, 16}).to(torch::kFloat8_e4m3fn),
                             torch::zeros({16, 16}).to(torch::kFloat8_e4m3fn), torch::ones({})};
  EXPECT_THROW(fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kDelayed, &h, false, true, &wrong),
               fabric::Error);
  fabric::nn::Fp8Input right{torch::zeros({16, 32}).to(torch::kFloat8_e4m3fn),
                             torch::zeros({32, 16}).to(torch::kFloat8_e4m3fn), torch::ones({})};
  EXPECT_THROW(
      fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kTensorwise, nullptr, false, true, &right),
      fabric::Error);
  Fp8History h1(4), h2(4);  // not seeded
  const std::vector<fabric::nn::Fp8Layer> two = {{w, {}, &h1, true}, {w, {}, &h2, true}};
  EXPECT_THROW(fabric::nn::fp8_linears(x, two, Fp8Scaling::kDelayed, &right), fabric::Error);
  EXPECT_THROW(fabric::nn::fp8_linears(x, {{w, {}, nullptr, true}, {w, {}, nullptr, true}},
                                       Fp8Scaling::kTensorwise, &right),
               fabric::Error);
  const fabric::nn::Fp8Input amax{{}, {}, {}, torch::ones({})};
  EXPECT_THROW(fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kDelayed, &h, false, true, &amax),
               fabric::Error);
  EXPECT_THROW(
      fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kTensorwise, nullptr, true, true, &amax),
      fabric::Error);
  EXPECT_NO_THROW(
      fabric::nn::fp8_linear(x, w, {}, Fp8Scaling::kTensorwise, nullptr, false, true, &amax));
  const fabric::nn::Fp8Layer down{torch::randn({32, 48}), {}, &h, true};
  EXPECT_THROW(
      fabric::nn::fp8_swiglu_mlp(x, two[0], two[1], down, Fp8Scaling::kDelayed, nullptr, &right),
      fabric::Error);
}

}  // namespace
