// LoRA with the frozen base stored in bf16 or float8 (fabric::nn::store_lora_base, issue 70):
// outputs, the input's and the adapters' gradients against the float32 layer, under 32-true and
// CPU autocast (bf16-mixed); merges from the dequantized weight; the per-row scale under tensor
// parallelism (two ranks as threads over Gloo).
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/frozen_weight.h"
#include "fabric/nn/lora.h"
#include "fabric/nn/tensor_parallel.h"
#include "tests/thread_ranks.h"

namespace {

using fabric::nn::LoraBaseDtype;

// Two adapted layers and one without adapter (it must stay as it is).
struct Net : torch::nn::Module {
  Net() {
    up = register_module("up", fabric::nn::Linear(64, 96));
    down = register_module("down", fabric::nn::Linear(96, 48));
    head = register_module("head", fabric::nn::Linear(48, 32));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return head->forward(torch::gelu(down->forward(torch::gelu(up->forward(x)))));
  }
  fabric::nn::Linear up{nullptr}, down{nullptr}, head{nullptr};
};

std::shared_ptr<Net> adapted_net() {
  torch::manual_seed(3);
  auto net = std::make_shared<Net>();
  fabric::nn::LoraOptions o;
  o.rank = 4;
  o.alpha = 8;
  o.target_modules = {"up", "down"};
  fabric::nn::apply_lora(*net, o);
  torch::NoGradGuard no_grad;  // B off zero: both adapters' gradients non-zero
  for (auto* l : {&net->up, &net->down}) (*l)->lora_B->weight.normal_(0, 0.1);
  return net;
}

struct Result {
  torch::Tensor y, dx;
  std::vector<torch::Tensor> grads;  // up's A, B, down's A, B
};

Result run(Net& net, const torch::Tensor& x, bool autocast) {
  Result r;
  const torch::Tensor in = x.clone().requires_grad_();
  if (autocast) {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  }
  r.y = net.forward(in);
  if (autocast) {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  r.y.to(torch::kFloat).pow(2).sum().backward();
  r.dx = in.grad();
  for (auto* l : {&net.up, &net.down})
    for (auto* t : {&(*l)->lora_A->weight, &(*l)->lora_B->weight}) r.grads.push_back(t->grad());
  return r;
}

// max |a - b| / max |b|.
double rel(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat) - b.to(torch::kFloat)).abs().max().item<double>() /
         b.to(torch::kFloat).abs().max().item<double>();
}

// Bounds: about 2x the largest error measured on this test's seeds (2026-11-29, CPU, LibTorch
// 2.11; relative to the float32 layer's largest magnitude): bf16 y 1.7e-3, dx 3.0e-3, adapter
// gradients 3.4e-3; fp8 (e4m3, per-row scale) y 2.5e-2, dx 4.4e-2, adapter gradients 5.1e-2.
// Under autocast the reference is the float32 base under the same autocast, which rounds the
// weight to bf16 itself: bf16 storage adds nothing there (measured 0), fp8 what it adds above.
struct Bound {
  double y, dx, grads;
};

TEST(LoraBaseDtypeTest, StoredBaseComputesAsTheFloat32OneWithinItsRounding) {
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({3, 5, 64});
  for (bool autocast : {false, true}) {
    auto ref_net = adapted_net();
    const Result ref = run(*ref_net, x, autocast);
    for (LoraBaseDtype d : {LoraBaseDtype::kBf16, LoraBaseDtype::kFp8}) {
      SCOPED_TRACE(fabric::nn::to_string(d) + (autocast ? ", autocast bf16" : ", float32"));
      auto net = adapted_net();
      const torch::Tensor head_before = net->head->weight.detach().clone();
      const auto stored = fabric::nn::store_lora_base(*net, d);
      EXPECT_EQ(stored, (std::vector<std::string>{"up", "down"}));
      const auto want = d == LoraBaseDtype::kBf16 ? torch::kBFloat16 : torch::kFloat8_e4m3fn;
      EXPECT_EQ(net->up->weight.scalar_type(), want);
      EXPECT_EQ(net->head->weight.scalar_type(), torch::kFloat);  // no adapter: as it was
      EXPECT_TRUE(torch::equal(net->head->weight, head_before));
      EXPECT_EQ(net->up->named_buffers(false).contains(fabric::nn::kWeightScale),
                d == LoraBaseDtype::kFp8);
      const Result r = run(*net, x, autocast);
      const Bound b = d == LoraBaseDtype::kBf16 ? Bound{4e-3, 6e-3, 7e-3} : Bound{5e-2, 9e-2, 1e-1};
      std::printf("%s%s: y %.3g dx %.3g grads", fabric::nn::to_string(d).c_str(),
                  autocast ? " autocast" : "", rel(r.y, ref.y), rel(r.dx, ref.dx));
      EXPECT_EQ(r.y.scalar_type(), ref.y.scalar_type());
      EXPECT_EQ(r.dx.scalar_type(), torch::kFloat);
      EXPECT_LT(rel(r.y, ref.y), b.y);
      EXPECT_LT(rel(r.dx, ref.dx), b.dx);
      for (size_t i = 0; i < ref.grads.size(); ++i) {
        std::printf(" %.3g", rel(r.grads[i], ref.grads[i]));
        EXPECT_LT(rel(r.grads[i], ref.grads[i]), b.grads) << i;
      }
      std::printf("\n");
      EXPECT_FALSE(net->up->weight.grad().defined());  // frozen: no gradient
      // Stored once is enough: again changes nothing; another dtype is refused.
      EXPECT_TRUE(fabric::nn::store_lora_base(*net, d).empty());
      EXPECT_THROW(
          fabric::nn::store_lora_base(
              *net, d == LoraBaseDtype::kBf16 ? LoraBaseDtype::kFp8 : LoraBaseDtype::kBf16),
          fabric::Error);
    }
  }
}

TEST(LoraBaseDtypeTest, Float8ScaleIsPerRow) {
  torch::manual_seed(5);
  const torch::Tensor w = torch::randn({6, 32}) * torch::arange(1, 7).unsqueeze(1);
  auto [q, scale] = fabric::nn::quantize_rows_fp8(w, w.abs().amax({1}));
  EXPECT_EQ(q.scalar_type(), torch::kFloat8_e4m3fn);
  EXPECT_TRUE(torch::allclose(scale, w.abs().amax({1}) / 448));
  // Each row's largest magnitude maps to 448 exactly; every element within e4m3's half step
  // (2^-4 relative for normals) of the row's scale.
  const torch::Tensor back = fabric::nn::dequantize_weight(q, scale, torch::kFloat);
  EXPECT_TRUE(torch::allclose(back.abs().amax({1}), w.abs().amax({1}), 1e-6, 0));
  EXPECT_LE(((back - w).abs() / (w.abs() + scale.unsqueeze(1) * 0.0156)).max().item<double>(),
            0.0625);
  // A row of zeros: scale 1, zeros back.
  auto [q0, s0] = fabric::nn::quantize_rows_fp8(torch::zeros({2, 4}), torch::zeros({2}));
  EXPECT_TRUE(torch::equal(s0, torch::ones({2})));
  EXPECT_TRUE(torch::equal(q0.to(torch::kFloat), torch::zeros({2, 4})));
}

TEST(LoraBaseDtypeTest, MergeFoldsTheAdapterIntoTheDequantizedWeight) {
  for (LoraBaseDtype d : {LoraBaseDtype::kBf16, LoraBaseDtype::kFp8}) {
    SCOPED_TRACE(fabric::nn::to_string(d));
    auto net = adapted_net();
    fabric::nn::store_lora_base(*net, d);
    const auto buffers = net->up->named_buffers(false);
    const torch::Tensor scale = buffers.contains(fabric::nn::kWeightScale)
                                    ? buffers[fabric::nn::kWeightScale]
                                    : torch::Tensor();
    const torch::Tensor expected =
        fabric::nn::dequantize_weight(net->up->weight.detach(), scale, torch::kFloat) +
        torch::matmul(net->up->lora_B->weight, net->up->lora_A->weight).detach() * 2.0;
    // merge_lora_state on the whole state (what the example's merged export does).
    std::vector<std::pair<std::string, torch::Tensor>> whole;
    for (const auto& p : net->named_parameters()) whole.emplace_back(p.key(), p.value().detach());
    for (const auto& b : net->named_buffers()) whole.emplace_back(b.key(), b.value().detach());
    fabric::nn::LoraOptions o;
    o.rank = 4;
    o.alpha = 8;
    fabric::nn::merge_lora_state(whole, o);
    std::vector<std::string> names;
    for (const auto& [name, t] : whole) {
      names.push_back(name);
      EXPECT_EQ(t.scalar_type(), torch::kFloat) << name;  // the adapters' dtype
    }
    EXPECT_EQ(names, (std::vector<std::string>{"up.weight", "up.bias", "down.weight", "down.bias",
                                               "head.weight", "head.bias"}));
    EXPECT_TRUE(torch::allclose(whole[0].second, expected, 1e-6, 1e-6));
    // merge_lora in the model: the same weight, the model computing what it did.
    const torch::Tensor x = torch::randn({2, 64});
    torch::NoGradGuard no_grad;
    const torch::Tensor before = net->forward(x);
    fabric::nn::merge_lora(*net);
    EXPECT_EQ(net->up->weight.scalar_type(), torch::kFloat);
    EXPECT_TRUE(torch::allclose(net->up->weight, expected, 1e-6, 1e-6));
    EXPECT_TRUE(torch::allclose(net->forward(x), before, 1e-5, 1e-5));
  }
}

TEST(LoraBaseDtypeTest, RefusesATrainedOrUnloadedBaseAndBadNames) {
  auto net = std::make_shared<Net>();
  net->up->set_lora(2, 1.0, 0.0);  // no apply_lora: the weight still trains
  try {
    fabric::nn::store_lora_base(*net, LoraBaseDtype::kBf16);
    FAIL() << "no error";
  } catch (const fabric::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'up' has a weight that trains"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fabric::nn::parse_lora_base_dtype("fp8"), LoraBaseDtype::kFp8);
  EXPECT_THROW(fabric::nn::parse_lora_base_dtype("fp16"), fabric::Error);
  EXPECT_TRUE(fabric::nn::store_lora_base(*net, LoraBaseDtype::kAuto).empty());
}

// A fused column(3) layer and a row layer, their float8 bases stored whole before the split
// (set_parallel cuts a column layer's scale with its rows, keeps a row layer's whole) or after it
// (a row layer's scale from the row's largest magnitude over the ranks): both ranks compute, and
// train the adapters, as the whole stored block; unparallelize makes weight and scale whole.
struct Block : torch::nn::Module {
  Block() {
    qkv = register_module("qkv", fabric::nn::Linear(8, 24));
    proj = register_module("proj", fabric::nn::Linear(8, 6));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto parts = qkv->forward(x).chunk(3, -1);
    return proj->forward(parts[0] * parts[1] + parts[2]);
  }
  fabric::nn::Linear qkv{nullptr}, proj{nullptr};
};

std::shared_ptr<Block> stored_block(bool store) {
  torch::manual_seed(6);
  auto b = std::make_shared<Block>();
  fabric::nn::LoraOptions o;
  o.rank = 2;
  o.target_modules = {"qkv", "proj"};
  fabric::nn::apply_lora(*b, o);
  {
    torch::NoGradGuard no_grad;
    b->qkv->lora_B->weight.normal_();
    b->proj->lora_B->weight.normal_();
  }
  if (store) fabric::nn::store_lora_base(*b, LoraBaseDtype::kFp8);
  return b;
}

TEST(LoraBaseDtypeTest, Float8BaseUnderTensorParallelismComputesAsTheWholeBlock) {
  torch::manual_seed(7);
  const torch::Tensor x = torch::randn({2, 4, 8});
  auto whole = stored_block(true);
  const torch::Tensor in = x.clone().requires_grad_();
  const torch::Tensor ref_y = whole->forward(in);
  ref_y.sum().backward();
  const torch::Tensor ref_dx = in.grad(), ref_da = whole->proj->lora_A->weight.grad();
  const torch::Tensor ref_qkv = whole->qkv->weight.detach().to(torch::kFloat);
  for (bool after : {false, true}) {
    SCOPED_TRACE(after ? "stored after the split" : "stored before the split");
    std::vector<std::shared_ptr<Block>> blocks = {stored_block(!after), stored_block(!after)};
    std::vector<torch::Tensor> ys(2), dxs(2), das(2);
    std::vector<std::vector<int64_t>> scale_sizes(2);
    const auto errors = fabric::testing::on_thread_ranks(2, [&](int64_t rank, const auto& group) {
      Block& b = *blocks[rank];
      fabric::nn::TensorParallelPlan plan{{{"qkv", fabric::nn::TensorParallelStyle::column(3)},
                                           {"proj", fabric::nn::TensorParallelStyle::row()}}};
      fabric::nn::parallelize(b, plan, group);
      if (after) fabric::nn::store_lora_base(b, LoraBaseDtype::kFp8);
      for (auto* l : {&b.qkv, &b.proj})
        scale_sizes[rank].push_back((*l)->named_buffers(false)[fabric::nn::kWeightScale].size(0));
      const torch::Tensor xin = x.clone().requires_grad_();
      ys[rank] = b.forward(xin);
      ys[rank].sum().backward();
      dxs[rank] = xin.grad();
      das[rank] = b.proj->parallel()->gather(b.proj->lora_A->weight.grad(), 1);
      fabric::nn::unparallelize(b);
      EXPECT_TRUE(torch::equal(b.qkv->weight.to(torch::kFloat), ref_qkv));
      EXPECT_TRUE(torch::equal(b.qkv->named_buffers(false)[fabric::nn::kWeightScale],
                               whole->qkv->named_buffers(false)[fabric::nn::kWeightScale]));
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(errors[r], "");
      EXPECT_EQ(scale_sizes[r], (std::vector<int64_t>{12, 6}));  // column: its rows; row: whole
      EXPECT_TRUE(torch::allclose(ys[r], ref_y, 1e-5, 1e-5));
      EXPECT_TRUE(torch::allclose(dxs[r], ref_dx, 1e-5, 1e-5));
      EXPECT_TRUE(torch::allclose(das[r], ref_da, 1e-5, 1e-5));
    }
  }
}

}  // namespace
