// Ring attention's math on one process: parts over disjoint keys merge into the attention over
// all of them, the simulated ring equals SDPA (values and gradients), the load-balanced split
// gives every rank the same causal work (a contiguous split does not), and bad lengths or head
// counts fail with messages that say what to do.
#include "fabric/nn/ring_attention.h"

#include <ATen/ops/scaled_dot_product_attention.h>
#include <gtest/gtest.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fabric/core/error.h"

namespace {

using fabric::nn::attention_part;
using fabric::nn::AttentionMask;
using fabric::nn::AttentionPart;
using fabric::nn::merge_attention;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

// The largest difference relative to max(1, |b|), for log-sum-exps: they are about log(keys) (4
// for 40 keys), where one float32 ulp is already 4.8e-7; -inf on both sides counts as equal.
double max_rel_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  const torch::Tensor both_inf = x.isneginf().logical_and(y.isneginf());
  const torch::Tensor d = ((x - y).abs() / y.abs().clamp_min(1.0)).masked_fill(both_inf, 0.0);
  return d.max().item<double>();
}

// The message of the fabric::Error `f` throws ("" if it throws none).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const fabric::Error& e) {
    return e.what();
  }
  return "";
}

// Merges the attention parts of q over the key pieces [cuts[i], cuts[i+1]) in the given order.
AttentionPart merged_over(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          AttentionMask mask, int64_t q_offset, const std::vector<int64_t>& cuts,
                          const std::vector<size_t>& order) {
  AttentionPart acc;
  for (size_t i : order) {
    const int64_t begin = cuts[i], len = cuts[i + 1] - cuts[i];
    acc = merge_attention(acc, attention_part(q, k.narrow(2, begin, len), v.narrow(2, begin, len),
                                              mask, q_offset, begin));
  }
  return acc;
}

TEST(RingAttention, WholeBlockMatchesSdpaAndLogSumExp) {
  torch::manual_seed(1);
  const torch::Tensor q = torch::randn({2, 4, 16, 8}), k = torch::randn({2, 2, 40, 8}),
                      v = torch::randn({2, 2, 40, 8});
  const AttentionPart whole = attention_part(q, k, v, AttentionMask::kNone, 0, 0);
  const torch::Tensor sdpa =
      at::scaled_dot_product_attention(q, k, v, {}, 0.0, false, std::nullopt, /*enable_gqa=*/true);
  EXPECT_LE(max_diff(whole.out, sdpa), 1e-6);
  // lse by hand, query head h reading key head h / 2.
  const torch::Tensor kk = k.repeat_interleave(2, 1);
  const torch::Tensor lse = (torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(8.0)).logsumexp(-1);
  EXPECT_LE(max_rel_diff(whole.lse, lse), 1e-6);
  EXPECT_EQ(whole.out.scalar_type(), torch::kFloat);
  EXPECT_EQ(whole.lse.sizes(), torch::IntArrayRef({2, 4, 16}));
}

TEST(RingAttention, MergeOverAnySplitOfKeysEqualsOneAttention) {
  torch::manual_seed(2);
  const torch::Tensor q = torch::randn({2, 4, 16, 8}), k = torch::randn({2, 2, 40, 8}),
                      v = torch::randn({2, 2, 40, 8});
  const AttentionPart whole = attention_part(q, k, v, AttentionMask::kNone, 0, 0);
  const std::vector<std::vector<int64_t>> splits = {
      {0, 1, 40}, {0, 20, 40}, {0, 7, 8, 31, 40}, {0, 3, 13, 23, 33, 39, 40}};
  for (const auto& cuts : splits) {
    std::vector<size_t> order(cuts.size() - 1);
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    for (bool reversed : {false, true}) {
      if (reversed) std::reverse(order.begin(), order.end());
      const AttentionPart m = merged_over(q, k, v, AttentionMask::kNone, 0, cuts, order);
      EXPECT_LE(max_diff(m.out, whole.out), 1e-6) << cuts.size() - 1 << " pieces";
      EXPECT_LE(max_rel_diff(m.lse, whole.lse), 1e-6) << cuts.size() - 1 << " pieces";
    }
  }
}

TEST(RingAttention, CausalMergeWithFullyMaskedPartEqualsOneAttention) {
  torch::manual_seed(3);
  // Queries at global positions 20..35, keys at 0..39: keys 36..39 are in every query's future.
  const torch::Tensor q = torch::randn({1, 4, 16, 8}, torch::requires_grad()),
                      k = torch::randn({1, 4, 40, 8}, torch::requires_grad()),
                      v = torch::randn({1, 4, 40, 8}, torch::requires_grad());
  const AttentionPart whole = attention_part(q, k, v, AttentionMask::kCausal, 20, 0);
  const AttentionPart future =
      attention_part(q, k.narrow(2, 36, 4), v.narrow(2, 36, 4), AttentionMask::kCausal, 20, 36);
  EXPECT_EQ(future.out.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(future.lse.isneginf().all().item<bool>());
  for (const auto& order :
       std::vector<std::vector<size_t>>{{0, 1, 2, 3}, {3, 2, 1, 0}, {3, 0, 2, 1}}) {
    const AttentionPart m =
        merged_over(q, k, v, AttentionMask::kCausal, 20, {0, 10, 21, 36, 40}, order);
    EXPECT_LE(max_diff(m.out, whole.out), 1e-6);
    EXPECT_LE(max_rel_diff(m.lse, whole.lse), 1e-6);
  }
  // A row masked on both sides stays out 0, lse −inf; the backward through it has no NaN.
  const AttentionPart empty = merge_attention(future, future);
  EXPECT_EQ(empty.out.abs().max().item<float>(), 0.0f);
  EXPECT_TRUE(empty.lse.isneginf().all().item<bool>());
  const AttentionPart with_past = merge_attention(
      empty,
      attention_part(q, k.narrow(2, 0, 20), v.narrow(2, 0, 20), AttentionMask::kCausal, 20, 0));
  (with_past.out.sum() + empty.out.sum()).backward();
  for (const torch::Tensor& g : {q.grad(), k.grad(), v.grad()}) {
    EXPECT_TRUE(g.isfinite().all().item<bool>());
  }
  // The keys in the future get no gradient.
  EXPECT_EQ(k.grad().narrow(2, 20, 20).abs().max().item<float>(), 0.0f);
}

TEST(RingAttention, RingReferenceEqualsSdpaWithGradients) {
  const int64_t B = 1, H = 8, Hk = 2, T = 1024, D = 16;
  for (int64_t cp : {1, 2, 4}) {
    for (bool causal : {false, true}) {
      torch::manual_seed(10 + cp);
      const torch::Tensor q0 = torch::randn({B, H, T, D}), k0 = torch::randn({B, Hk, T, D}),
                          v0 = torch::randn({B, Hk, T, D}), g = torch::randn({B, H, T, D});
      const torch::Tensor q1 = q0.clone().requires_grad_(), k1 = k0.clone().requires_grad_(),
                          v1 = v0.clone().requires_grad_();
      const torch::Tensor q2 = q0.clone().requires_grad_(), k2 = k0.clone().requires_grad_(),
                          v2 = v0.clone().requires_grad_();
      const torch::Tensor ring = fabric::nn::ring_attention_reference(q1, k1, v1, cp, causal);
      const torch::Tensor sdpa = at::scaled_dot_product_attention(
          q2, k2, v2, {}, 0.0, causal, std::nullopt, /*enable_gqa=*/true);
      const std::string where = "cp=" + std::to_string(cp) + (causal ? " causal" : " full");
      EXPECT_LE(max_diff(ring, sdpa), 1e-5) << where;
      (ring * g).sum().backward();
      (sdpa * g).sum().backward();
      EXPECT_LE(max_diff(q1.grad(), q2.grad()), 1e-5) << where << " dq";
      EXPECT_LE(max_diff(k1.grad(), k2.grad()), 1e-5) << where << " dk";
      EXPECT_LE(max_diff(v1.grad(), v2.grad()), 1e-5) << where << " dv";
    }
  }
}

TEST(RingAttention, LoadBalancedSplitEvensCausalWorkContiguousDoesNot) {
  const int64_t T = 1024;
  for (int64_t cp : {2, 4, 8}) {
    const int64_t c = fabric::nn::cp_chunk_size(T, cp);
    // The ranks' positions partition 0..T-1.
    std::vector<int> seen(T, 0);
    for (int64_t r = 0; r < cp; ++r) {
      const std::vector<int64_t> pos = fabric::nn::cp_rank_positions(T, cp, r);
      ASSERT_EQ(static_cast<int64_t>(pos.size()), 2 * c);
      for (int64_t p : pos) ++seen[p];
    }
    for (int64_t p = 0; p < T; ++p) ASSERT_EQ(seen[p], 1) << "position " << p;
    // Visible (query, key) pairs per rank: its query chunks against every key chunk.
    std::vector<int64_t> balanced, contiguous;
    int64_t total = 0;
    for (int64_t r = 0; r < cp; ++r) {
      int64_t pairs = 0;
      for (int64_t qc : fabric::nn::load_balanced_chunks(cp, r)) {
        for (int64_t kc = 0; kc < 2 * cp; ++kc) {
          pairs += fabric::nn::causal_visible(qc * c, c, kc * c, c).sum().item<int64_t>();
        }
      }
      balanced.push_back(pairs);
      total += pairs;
      const int64_t L = T / cp;
      contiguous.push_back(fabric::nn::causal_visible(r * L, L, 0, T).sum().item<int64_t>());
    }
    EXPECT_EQ(total, T * (T + 1) / 2) << "cp=" << cp;
    for (int64_t r = 1; r < cp; ++r) {
      EXPECT_EQ(balanced[r], balanced[0]) << "cp=" << cp << " rank " << r;
      // Contiguous: every later rank has strictly more work than the one before it.
      EXPECT_GT(contiguous[r], contiguous[r - 1]) << "cp=" << cp << " rank " << r;
    }
    // The last contiguous rank does about 2·cp − 1 times the first's work.
    EXPECT_GT(contiguous[cp - 1], (2 * cp - 2) * contiguous[0]) << "cp=" << cp;
  }
}

TEST(RingAttention, ChunksAndErrors) {
  EXPECT_EQ(fabric::nn::load_balanced_chunks(4, 1), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(fabric::nn::load_balanced_chunks(1, 0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(fabric::nn::cp_rank_positions(8, 2, 1), (std::vector<int64_t>{2, 3, 4, 5}));
  EXPECT_NE(error_of([] { fabric::nn::load_balanced_chunks(2, 2); }), "");

  const std::string length = error_of([] { fabric::nn::cp_chunk_size(1001, 4); });
  for (const char* part : {"T=1001", "cp=4", "2*cp=8", "T=1000", "T=1008"}) {
    EXPECT_NE(length.find(part), std::string::npos) << part << " not in: " << length;
  }
  EXPECT_EQ(length.find('\n'), std::string::npos) << length;
  const std::string short_length = error_of([] { fabric::nn::cp_chunk_size(3, 2); });
  EXPECT_NE(short_length.find("T=4"), std::string::npos) << short_length;
  EXPECT_NE(error_of([] {
              fabric::nn::ring_attention_reference(torch::zeros({1, 2, 12, 4}),
                                                   torch::zeros({1, 2, 12, 4}),
                                                   torch::zeros({1, 2, 12, 4}), 4, true);
            }).find("T=12"),
            std::string::npos);

  const std::string heads = error_of([] {
    attention_part(torch::zeros({1, 8, 4, 4}), torch::zeros({1, 3, 4, 4}),
                   torch::zeros({1, 3, 4, 4}), AttentionMask::kNone, 0, 0);
  });
  EXPECT_NE(heads.find("3 key/value heads do not divide 8 query heads"), std::string::npos)
      << heads;
  EXPECT_NE(error_of([] {
              fabric::nn::ring_attention_reference(torch::zeros({1, 8, 8, 4}),
                                                   torch::zeros({1, 3, 8, 4}),
                                                   torch::zeros({1, 3, 8, 4}), 2, false);
            }).find("do not divide"),
            std::string::npos);
}

}  // namespace
