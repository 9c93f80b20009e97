// The float8 weight casts kept between passes (fabric/nn/fp8.h: release_fp8_weights), on the
// CPU: micro-batches over an unchanged weight reuse one cast (counted), a weight changed in
// place is cast again, and every output and gradient is bitwise a layer's that casts each pass
// (tensorwise), or, under delayed scaling, a layer's that casts each pass from the history the
// weight's first pass read, with the weight's history row pushed once per change.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstring>
#include <string>
#include <vector>

#include "fabric/nn/fp8.h"

namespace {

using fabric::nn::Fp8History;
using fabric::nn::Fp8Scaling;

void expect_same(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_TRUE(torch::equal(a, b)) << what << ": max difference "
                                  << (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max();
}

// A weight [64, 32] and bias as parameters, and the same values in a twin the cache never keeps.
struct Layer {
  torch::Tensor w, b, twin_w, twin_b;
  Layer() {
    torch::manual_seed(11);
    w = torch::randn({64, 32}).requires_grad_();
    b = torch::randn({64}).mul_(0.1).requires_grad_();
    twin_w = w.detach().clone().requires_grad_();
    twin_b = b.detach().clone().requires_grad_();
    fabric::nn::set_fp8_weight_cached(twin_w, false);
  }
  // An optimizer step of both: the weight changed in place, its largest magnitude growing 1.5x
  // a step (so that a delayed history's largest entry changes with each push).
  void step() {
    torch::NoGradGuard no_grad;
    for (auto* p : {&w, &twin_w}) p->mul_(1.5).sub_(p->grad(), 1e-2);
    for (auto* p : {&b, &twin_b}) p->sub_(p->grad(), 1e-2);
    for (auto* p : {&w, &b, &twin_w, &twin_b}) p->mutable_grad() = torch::Tensor();
  }
};

// One micro-batch through the layer and its twin (each with its own history under delayed
// scaling: `history` the layer's, `twin` the twin's), backward with one output gradient; outputs
// and input gradients compared bitwise.
void micro_batch(Layer& l, Fp8Scaling scaling, Fp8History* history, Fp8History* twin,
                 const std::string& what) {
  const torch::Tensor x = torch::randn({48, 32}).requires_grad_();
  const torch::Tensor x2 = x.detach().clone().requires_grad_();
  const torch::Tensor g = torch::randn({48, 64});
  const torch::Tensor y = fabric::nn::fp8_linear(x, l.w, l.b, scaling, history);
  const torch::Tensor y2 = fabric::nn::fp8_linear(x2, l.twin_w, l.twin_b, scaling, twin);
  expect_same(y, y2, what + ": output");
  (y * g).sum().backward();
  (y2 * g).sum().backward();
  expect_same(x.grad(), x2.grad(), what + ": input gradient");
}

// Micro-batches per optimizer step: a weight read once keeps no cast for the next change; one
// read 3 times (after one read once) is cast twice, the cast kept from its second pass; after
// that from its first.
const std::vector<int> kSchedule = {1, 3, 3, 2};
const std::vector<int64_t> kCasts = {1, 2, 1, 1};

TEST(Fp8WeightCacheTest, TensorwiseMicroBatchesReuseOneCastBitwise) {
  Layer l;
  for (size_t s = 0; s < kSchedule.size(); ++s) {
    int64_t twin_casts = 0, casts = 0;
    for (int m = 0; m < kSchedule[s]; ++m) {
      const int64_t before = fabric::nn::fp8_weight_casts();
      micro_batch(l, Fp8Scaling::kTensorwise, nullptr, nullptr,
                  "step " + std::to_string(s) + ", micro-batch " + std::to_string(m));
      // Each call casts the twin's weight; the rest are the layer's.
      casts += fabric::nn::fp8_weight_casts() - before - 1;
      ++twin_casts;
    }
    EXPECT_EQ(casts, kCasts[s]) << "weight casts in step " << s << " (" << kSchedule[s]
                                << " micro-batches)";
    // The weights' gradients, summed over the micro-batches, bitwise the twin's.
    expect_same(l.w.grad(), l.twin_w.grad(), "step " + std::to_string(s) + ": weight gradient");
    expect_same(l.b.grad(), l.twin_b.grad(), "step " + std::to_string(s) + ": bias gradient");
    l.step();  // no release_fp8_weights(): the in-place change alone must show
  }
}

TEST(Fp8WeightCacheTest, DelayedPushesTheWeightOncePerChangeAndCastsFromItsFirstPass) {
  Layer l;
  Fp8History history(4);
  for (size_t s = 0; s < kSchedule.size(); ++s) {
    // What the weight's first pass of this step reads: the twin casts every pass from it.
    const torch::Tensor first_row =
        history.amax.defined() ? history.amax[1].clone() : torch::Tensor();
    torch::Tensor pushed_row;  // the weight's row after its first pass pushed its amax
    int64_t casts = 0;
    for (int m = 0; m < kSchedule[s]; ++m) {
      Fp8History twin(4);
      if (history.amax.defined()) {
        twin.amax = history.amax.clone();
        twin.seeded = history.seeded.clone();
        twin.amax[1].copy_(first_row);
      }
      const int64_t before = fabric::nn::fp8_weight_casts();
      micro_batch(l, Fp8Scaling::kDelayed, &history, &twin,
                  "step " + std::to_string(s) + ", micro-batch " + std::to_string(m));
      casts += fabric::nn::fp8_weight_casts() - before - 1;
      // The input's and the gradient's rows advance every pass, as the twin's.
      expect_same(history.amax[0], twin.amax[0], "input history row");
      expect_same(history.amax[2], twin.amax[2], "gradient history row");
      if (m == 0) pushed_row = twin.amax[1].clone();
    }
    EXPECT_EQ(casts, kCasts[s]) << "weight casts in step " << s;
    expect_same(history.amax[1], pushed_row,
                "step " + std::to_string(s) + ": the weight's row (one push for " +
                    std::to_string(kSchedule[s]) + " micro-batches)");
    expect_same(l.w.grad(), l.twin_w.grad(), "step " + std::to_string(s) + ": weight gradient");
    l.step();
  }
}

// Activation checkpointing's pattern: a pass without a graph, then its recomputation that
// records: the recording pass is the one that pushes, from the history the first read, so both
// casts equal a layer's casting each pass (no push skipped, none doubled). Once the weight's
// last version had both passes, the first pass's cast is kept and the second casts nothing: the
// push it owes is the one the first made into a copy of the row.
TEST(Fp8WeightCacheTest, DelayedPassWithoutGraphThenItsRecordingPassAsUncached) {
  Layer l;
  Fp8History history(4), twin(4);
  const std::vector<int64_t> casts = {2, 1, 1};  // the first step: unseeded, then seeding
  for (int s = 0; s < 3; ++s) {
    const torch::Tensor x = torch::randn({48, 32});
    const int64_t before = fabric::nn::fp8_weight_casts();
    {
      torch::NoGradGuard no_grad;
      expect_same(fabric::nn::fp8_linear(x, l.w, l.b, Fp8Scaling::kDelayed, &history),
                  fabric::nn::fp8_linear(x, l.twin_w, l.twin_b, Fp8Scaling::kDelayed, &twin),
                  "step " + std::to_string(s) + ": the pass without a graph");
    }
    micro_batch(l, Fp8Scaling::kDelayed, &history, &twin, "step " + std::to_string(s));
    expect_same(history.amax, twin.amax, "step " + std::to_string(s) + ": the history");
    // Each pass casts the twin's weight; the rest are the layer's.
    EXPECT_EQ(fabric::nn::fp8_weight_casts() - before - 2, casts[s]) << "step " << s;
    l.step();
  }
}

// Off for the process, and for one weight: every pass casts.
TEST(Fp8WeightCacheTest, OffCastsEveryPass) {
  Layer l;
  struct BackOn {
    ~BackOn() { fabric::nn::set_fp8_weight_cache(true); }  // for the other tests, however it ends
  } back_on;
  fabric::nn::set_fp8_weight_cache(false);
  int64_t before = fabric::nn::fp8_weight_casts();
  for (int m = 0; m < 3; ++m) micro_batch(l, Fp8Scaling::kTensorwise, nullptr, nullptr, "off");
  EXPECT_EQ(fabric::nn::fp8_weight_casts() - before, 6);
  fabric::nn::set_fp8_weight_cache(true);
  fabric::nn::set_fp8_weight_cached(l.w, false);
  before = fabric::nn::fp8_weight_casts();
  for (int m = 0; m < 3; ++m) micro_batch(l, Fp8Scaling::kTensorwise, nullptr, nullptr, "one off");
  EXPECT_EQ(fabric::nn::fp8_weight_casts() - before, 6);
  // Back on for it: the second pass keeps its cast, the third reuses it.
  fabric::nn::set_fp8_weight_cached(l.w, true);
  before = fabric::nn::fp8_weight_casts();
  for (int m = 0; m < 3; ++m) micro_batch(l, Fp8Scaling::kTensorwise, nullptr, nullptr, "on");
  EXPECT_EQ(fabric::nn::fp8_weight_casts() - before, 3 + 2);
}

// release_fp8_weights drops what is kept: the next pass casts, and a change made without an
// in-place op (through the data pointer, as a collective writes) is seen after it.
TEST(Fp8WeightCacheTest, ReleaseDropsTheKeptCasts) {
  Layer l;
  for (int m = 0; m < 3; ++m) micro_batch(l, Fp8Scaling::kTensorwise, nullptr, nullptr, "before");
  {
    torch::NoGradGuard no_grad;
    const torch::Tensor w2 = l.w.detach() * 2;
    std::memcpy(l.w.data_ptr<float>(), w2.data_ptr<float>(), w2.numel() * sizeof(float));
    l.twin_w.mul_(2);
  }
  fabric::nn::release_fp8_weights();
  const int64_t before = fabric::nn::fp8_weight_casts();
  micro_batch(l, Fp8Scaling::kTensorwise, nullptr, nullptr, "after the release");
  EXPECT_EQ(fabric::nn::fp8_weight_casts() - before, 2);
}

}  // namespace
