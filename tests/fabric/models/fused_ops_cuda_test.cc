// The fused CUDA kernels of the GPT and the Llama family on a CUDA device (tag gpu; skips
// elsewhere): the fused LayerNorm and RMSNorm (fabric/models/fused_layer_norm.h) equal ATen's
// formulas alone, with the residual add before them, and with x's residual gradient summed inside
// the first norm's backward kernel (keep_*_norm_16); the rotary embedding and SwiGLU kernels
// (fused_llama_ops.h) equal ATen's chains; a tensor changed in place after a fused norm's forward
// is refused in backward. The models built with them: fused_models_cuda_test.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/nn/modules/normalization.h>
#include <torch/utils.h>

#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "fabric/models/fused_cross_entropy.h"
#include "fabric/models/fused_layer_norm.h"
#include "fabric/models/fused_llama_ops.h"
#include "tests/cuda_skip.h"
#include "tests/fabric/models/cuda_autocast.h"

namespace {

using fabric::testing::autocast_off;
using fabric::testing::autocast_on;
using fabric::testing::max_rel;

class FusedLayerNormTest : public ::testing::TestWithParam<torch::ScalarType> {};

// y = LayerNorm(x + d) with d 16-bit, h = x + d used again (as the residual path uses it):
// values and every gradient equal ATen's add + LayerNorm + cast to float32 rounding.
TEST_P(FusedLayerNormTest, AddLayerNormEqualsATenValuesAndGradients) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const torch::ScalarType t = GetParam();
  torch::manual_seed(0);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({768}));
  ln->to(torch::kCUDA);
  {
    torch::NoGradGuard no_grad;
    ln->weight.normal_(1.0, 0.2);
    ln->bias.normal_(0.0, 0.2);
  }
  const torch::Tensor x0 = 3 * torch::randn({4, 64, 768}, opts) + 1;
  const torch::Tensor d0 = torch::randn({4, 64, 768}, opts).to(t);
  const torch::Tensor r = torch::randn({4, 64, 768}, opts).to(t);
  const torch::Tensor q = torch::randn({4, 64, 768}, opts);
  struct Out {
    torch::Tensor h, y, dx, dd, dw, db;
  };
  auto run = [&](bool fused) {
    torch::Tensor x = x0.clone().requires_grad_(), d = d0.clone().requires_grad_();
    ln->zero_grad();
    autocast_on(t);
    EXPECT_TRUE(fabric::models::layer_norm_applies(x, ln));
    torch::Tensor h, y;
    if (fused) {
      std::tie(h, y) = fabric::models::add_layer_norm_16(x, d, ln);
    } else {
      h = x + d;
      y = ln->forward(h).to(t);
    }
    autocast_off();
    EXPECT_EQ(y.scalar_type(), t);
    EXPECT_EQ(h.scalar_type(), torch::kFloat);
    ((y * r).to(torch::kFloat).sum() + (h * q).sum()).backward();
    return Out{h.detach(),
               y.detach(),
               x.grad(),
               d.grad(),
               ln->weight.grad().clone(),
               ln->bias.grad().clone()};
  };
  const Out a = run(true), b = run(false);
  EXPECT_LE(max_rel(a.h, b.h), 1e-7);
  EXPECT_LE(max_rel(a.y, b.y), 1.0 / 128) << "more than one 16-bit step";
  EXPECT_LE(max_rel(a.dx, b.dx), 1e-4);
  EXPECT_EQ(a.dd.scalar_type(), t);
  EXPECT_LE(max_rel(a.dd, b.dd), 1.0 / 128);
  EXPECT_LE(max_rel(a.dw, b.dw), 1e-4);
  EXPECT_LE(max_rel(a.db, b.db), 1e-4);
  const Out again = run(true);
  EXPECT_TRUE(torch::equal(again.dw, a.dw)) << "weight gradient not bitwise reproducible";
  EXPECT_TRUE(torch::equal(again.dx, a.dx));
}

// keep_layer_norm_16 / keep_rms_norm_16 return x through the norm's node, so the residual add
// after it (add_*_norm_16 of that x) sends x's second gradient into the norm's backward kernel:
// against layer_norm_16 / rms_norm_16, where autograd sums x's two gradients, x's gradient the
// same to float32 rounding (the kernel may fuse its add into a multiply-add), the norm's weight
// gradients bitwise (the kernel takes them before the add), one node fewer.
TEST_P(FusedLayerNormTest, KeepNormSumsTheResidualGradientInItsKernel) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const torch::ScalarType t = GetParam();
  torch::manual_seed(4);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::nn::LayerNorm ln1(torch::nn::LayerNormOptions({256})), ln2(ln1->options);
  ln1->to(torch::kCUDA);
  ln2->to(torch::kCUDA);
  const torch::Tensor w1 = (1 + 0.1 * torch::randn({256}, opts)).requires_grad_(),
                      w2 = (1 + 0.1 * torch::randn({256}, opts)).requires_grad_();
  const torch::Tensor x0 = torch::randn({300, 256}, opts);
  const torch::Tensor r1 = torch::randn({300, 256}, opts).to(t),
                      r2 = torch::randn({300, 256}, opts).to(t), q = torch::randn({300, 256}, opts);
  for (const bool rms : {false, true}) {
    auto run = [&](bool keep) {
      torch::Tensor x = x0.clone().requires_grad_();
      ln1->zero_grad();
      w1.mutable_grad() = torch::Tensor();
      autocast_on(t);
      torch::Tensor x1 = x, y1;
      if (keep) {
        std::tie(x1, y1) = rms ? fabric::models::keep_rms_norm_16(x, w1, 1e-5)
                               : fabric::models::keep_layer_norm_16(x, ln1);
        EXPECT_NE(x1.grad_fn()->name().find("FusedKeepNorm"), std::string::npos)
            << x1.grad_fn()->name();
      } else {
        y1 = rms ? fabric::models::rms_norm_16(x, w1, 1e-5) : fabric::models::layer_norm_16(x, ln1);
      }
      const torch::Tensor d = y1 * r1;  // a 16-bit sublayer output
      const auto [h, y] = rms ? fabric::models::add_rms_norm_16(x1, d, w2, 1e-5)
                              : fabric::models::add_layer_norm_16(x1, d, ln2);
      autocast_off();
      ((y * r2).to(torch::kFloat).sum() + (h * q).sum()).backward();
      return std::vector<torch::Tensor>{x.grad(),
                                        rms ? w1.grad().clone() : ln1->weight.grad().clone()};
    };
    const auto a = run(true), b = run(false);
    EXPECT_LE(max_rel(a[0], b[0]), 1e-5) << (rms ? "RMSNorm" : "LayerNorm");
    EXPECT_TRUE(torch::equal(a[1], b[1])) << (rms ? "RMSNorm" : "LayerNorm");
  }
}

TEST_P(FusedLayerNormTest, LayerNormEqualsATen) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const torch::ScalarType t = GetParam();
  torch::manual_seed(1);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({256}));
  ln->to(torch::kCUDA);
  const torch::Tensor x0 = torch::randn({300, 256}, opts);
  const torch::Tensor r = torch::randn({300, 256}, opts).to(t);
  auto run = [&](bool fused) {
    torch::Tensor x = x0.clone().requires_grad_();
    ln->zero_grad();
    autocast_on(t);
    torch::Tensor y = fused ? fabric::models::layer_norm_16(x, ln) : ln->forward(x).to(t);
    autocast_off();
    (y * r).to(torch::kFloat).sum().backward();
    return std::vector<torch::Tensor>{y.detach(), x.grad(), ln->weight.grad().clone(),
                                      ln->bias.grad().clone()};
  };
  const auto a = run(true), b = run(false);
  EXPECT_LE(max_rel(a[0], b[0]), 1.0 / 128);
  for (int i : {1, 2, 3}) EXPECT_LE(max_rel(a[i], b[i]), 1e-4) << i;
}

// The RMSNorm forms (the Llama family's): add_rms_norm_16 / rms_norm_16 against the ATen formula
// (rms_norm_aten, what the Llama computes without them), values and gradients, the weight's
// gradient bitwise reproducible. Width 2048: the backward's shared memory above the 48 KiB
// default (64 KiB), as Llama-3.2-1B's.
TEST_P(FusedLayerNormTest, FusedRmsNormMatchesAten) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const torch::ScalarType t = GetParam();
  torch::manual_seed(2);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  const int64_t cols = 2048;
  const double eps = 1e-5;
  const torch::Tensor x0 = torch::randn({300, cols}, opts) * 3;
  const torch::Tensor d0 = torch::randn({300, cols}, opts).to(t);
  const torch::Tensor w0 = 1 + 0.1 * torch::randn({cols}, opts);
  const torch::Tensor r = torch::randn({300, cols}, opts).to(t);
  const torch::Tensor q = torch::randn({300, cols}, opts);
  for (const bool add : {true, false}) {
    auto run = [&](bool fused) {
      torch::Tensor x = x0.clone().requires_grad_(), d = d0.clone().requires_grad_();
      torch::Tensor w = w0.clone().requires_grad_();
      autocast_on(t);
      EXPECT_TRUE(fabric::models::rms_norm_applies(x, w));
      torch::Tensor h = x, y;
      if (fused && add) {
        std::tie(h, y) = fabric::models::add_rms_norm_16(x, d, w, eps);
      } else if (fused) {
        y = fabric::models::rms_norm_16(x, w, eps);
      } else {
        if (add) h = x + d;
        y = fabric::models::rms_norm_aten(h, w, eps).to(t);
      }
      autocast_off();
      EXPECT_EQ(y.scalar_type(), t);
      torch::Tensor loss = (y * r).to(torch::kFloat).sum();
      if (add) loss = loss + (h * q).sum();
      loss.backward();
      return std::vector<torch::Tensor>{y.detach(), x.grad(), w.grad().clone(),
                                        add ? d.grad() : torch::zeros({1}, opts)};
    };
    const auto a = run(true), b = run(false);
    EXPECT_LE(max_rel(a[0], b[0]), 1.0 / 128) << "add " << add << ": more than one 16-bit step";
    EXPECT_LE(max_rel(a[1], b[1]), 1e-4) << "add " << add << ": dx";
    EXPECT_LE(max_rel(a[2], b[2]), 1e-4) << "add " << add << ": dweight";
    if (add) {
      EXPECT_LE(max_rel(a[3], b[3]), 1.0 / 128) << "d's 16-bit gradient";
    }
    const auto again = run(true);
    EXPECT_TRUE(torch::equal(again[2], a[2])) << "weight gradient not bitwise reproducible";
  }
}

// The Llama's rotary embedding (the queries' transposed layout) and SwiGLU kernels
// (fused_llama_ops.h) against ATen's chains: values and gradients within one 16-bit step, and
// (printed) how many are bitwise ATen's.
TEST_P(FusedLayerNormTest, FusedRotaryAndSwigluMatchAten) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const torch::ScalarType t = GetParam();
  torch::manual_seed(3);
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  auto bitwise = [](const torch::Tensor& a, const torch::Tensor& b) {
    return a.eq(b).to(torch::kDouble).mean().item<double>();
  };
  {
    const torch::Tensor q0 = torch::randn({2, 64, 4, 64}, opts).to(t);  // [B, T, H, D]
    const torch::Tensor angles = torch::randn({64, 64}, opts);
    const torch::Tensor cos = angles.cos(), sin = angles.sin();  // float32, as under autocast
    const torch::Tensor r = torch::randn({2, 4, 64, 64}, opts).to(t);
    auto run = [&](bool fused) {
      torch::Tensor q = q0.clone().requires_grad_();
      const torch::Tensor v = q.transpose(1, 2);  // [B, H, T, D], as the attention's
      EXPECT_TRUE(fabric::models::llama_ops_apply(v));
      // ATen's result is float32, the fused one q's dtype: compared as autocast casts it.
      const torch::Tensor y = fused ? fabric::models::rotary_16(v, cos, sin)
                                    : (v * cos + fabric::models::rotate_half(v) * sin).to(t);
      (y * r).to(torch::kFloat).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), q.grad()};
    };
    const auto a = run(true), b = run(false);
    EXPECT_LE(max_rel(a[0], b[0]), 1.0 / 128) << "rotary forward";
    EXPECT_LE(max_rel(a[1], b[1]), 1.0 / 128) << "rotary backward";
    std::printf("rotary: %.4f of the outputs and %.4f of the gradients bitwise ATen's\n",
                bitwise(a[0], b[0]), bitwise(a[1], b[1]));
  }
  {
    const torch::Tensor g0 = torch::randn({300, 512}, opts).mul(3).to(t);
    const torch::Tensor u0 = torch::randn({300, 512}, opts).to(t);
    const torch::Tensor r = torch::randn({300, 512}, opts).to(t);
    auto run = [&](bool fused) {
      torch::Tensor g = g0.clone().requires_grad_(), u = u0.clone().requires_grad_();
      const torch::Tensor y = fused ? fabric::models::swiglu_16(g, u) : torch::silu(g) * u;
      (y * r).to(torch::kFloat).sum().backward();
      return std::vector<torch::Tensor>{y.detach(), g.grad(), u.grad()};
    };
    const auto a = run(true), b = run(false);
    for (int i : {0, 1, 2}) EXPECT_LE(max_rel(a[i], b[i]), 1.0 / 128) << "SwiGLU " << i;
    std::printf("SwiGLU: %.4f / %.4f / %.4f of y, dgate, dup bitwise ATen's\n", bitwise(a[0], b[0]),
                bitwise(a[1], b[1]), bitwise(a[2], b[2]));
  }
}

// The fused norms keep the tensor they normalized for their backward kernel outside autograd's
// saved tensors: changed in place after the forward, it must be refused as autograd refuses it
// for ATen's norm, not read silently; unchanged, backward runs. For each form: the norm's input
// (layer_norm_16, rms_norm_16, keep_*), the residual sum it returns (add_*).
TEST_P(FusedLayerNormTest, ATensorChangedInPlaceAfterTheForwardIsRefusedInBackward) {
  SKIP_WITHOUT_CUDA();
  if (!fabric::models::cuda_kernels_built()) GTEST_SKIP() << "no CUDA kernels in this build";
  const torch::ScalarType t = GetParam();
  const auto opts = torch::TensorOptions().device(torch::kCUDA);
  torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({128}));
  ln->to(torch::kCUDA);
  const torch::Tensor w = torch::ones({128}, opts).requires_grad_();
  const torch::Tensor x0 = torch::randn({16, 128}, opts);
  const torch::Tensor d = torch::randn({16, 128}, opts).to(t);
  enum Form { kPlain, kKeep, kAdd };
  for (const bool rms : {false, true}) {
    for (const Form form : {kPlain, kKeep, kAdd}) {
      for (const bool change : {false, true}) {
        const std::string what = std::string(rms ? "RMSNorm" : "LayerNorm") + " form " +
                                 std::to_string(form) + (change ? " changed" : " unchanged");
        torch::Tensor x = x0.clone().requires_grad_();
        torch::Tensor base = x * 1.0;  // not a leaf: in-place changes are allowed on it
        autocast_on(t);
        torch::Tensor changed = base, y;
        if (form == kPlain) {
          y = rms ? fabric::models::rms_norm_16(base, w, 1e-5)
                  : fabric::models::layer_norm_16(base, ln);
        } else if (form == kKeep) {
          std::tie(changed, y) = rms ? fabric::models::keep_rms_norm_16(base, w, 1e-5)
                                     : fabric::models::keep_layer_norm_16(base, ln);
        } else {
          std::tie(changed, y) = rms ? fabric::models::add_rms_norm_16(base, d, w, 1e-5)
                                     : fabric::models::add_layer_norm_16(base, d, ln);
        }
        autocast_off();
        // keep_*'s x comes back as a view made by the node, which autograd already refuses to
        // change in place: the change goes to its base, the tensor the node was given.
        if (change) (form == kAdd ? changed : base).mul_(2);
        torch::Tensor loss = y.to(torch::kFloat).pow(2).sum();
        if (form != kKeep) loss = loss + changed.sum();
        if (!change) {
          EXPECT_NO_THROW(loss.backward()) << what;
          continue;
        }
        try {
          loss.backward();
          ADD_FAILURE() << what << ": backward read a tensor changed in place";
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("modified by an inplace operation"),
                    std::string::npos)
              << what << ": " << e.what();
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, FusedLayerNormTest,
                         ::testing::Values(torch::kBFloat16, torch::kHalf));

}  // namespace
