// Context parallelism's attention math on one process (issue 71): the sequence is split over cp
// ranks, each rank keeps its queries and passes its keys and values around a ring, and the
// partial attentions it computes against each key/value block are merged exactly by their
// log-sum-exp. Nothing here communicates; ring_attention_reference simulates the whole ring step
// by step so that the distributed version can replace its hand-over with send/recv and keep the
// rest.
//
// Load balance under causal masking: the sequence of T tokens is cut into 2·cp chunks of T / (2·cp)
// and rank r holds chunks r and 2·cp−1−r (an early and a late one). A contiguous split would give
// the last rank the most (query, key) pairs to compute and the first the fewest; the pairing gives
// every rank exactly the same number.
//
// Everything is written with differentiable torch operations in float32, so autograd gives the
// backward (no custom backward yet); fully masked rows and −inf log-sum-exps never make NaNs,
// forward or backward.
#ifndef FABRIC_NN_RING_ATTENTION_H_
#define FABRIC_NN_RING_ATTENTION_H_

#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace fabric::nn {

// Attention of some queries over some of the keys: `out` [B, H, Tq, D] float32, normalized by its
// own softmax denominator (0 for a row that saw no key); `lse` [B, H, Tq] float32, the
// log-sum-exp of the scaled scores over the keys it saw (−inf for a row that saw none). Two parts
// over disjoint key sets merge into the attention over their union (merge_attention). A
// default-constructed part (undefined tensors) is the empty part: merging with it changes nothing.
struct AttentionPart {
  torch::Tensor out;
  torch::Tensor lse;
};

// kNone: every query sees every key of the block. kCausal: the query at global position
// q_offset + i sees the key at k_offset + j iff k_offset + j <= q_offset + i.
enum class AttentionMask { kNone, kCausal };

// The attention of q [B, H, Tq, D] against one block of keys k and values v [B, Hk, Tk, D], with
// `mask` over global positions (the block's queries start at q_offset, its keys at k_offset).
// Grouped-query attention: Hk must divide H, and query head h reads key/value head h / (H / Hk), as
// transformers' repeat_kv. Computed in float32 whatever the inputs' dtype; `scale` multiplies the
// scores (1/sqrt(D) when unset, as SDPA). Throws fabric::Error on mismatched shapes.
AttentionPart attention_part(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             AttentionMask mask, int64_t q_offset, int64_t k_offset,
                             std::optional<double> scale = std::nullopt);

// The exact merge of two parts over disjoint key sets: lse = log(exp(a.lse) + exp(b.lse)), out =
// a.out·exp(a.lse − lse) + b.out·exp(b.lse − lse). A row that is −inf on one side takes the other
// side's values; −inf on both stays out 0, lse −inf.
AttentionPart merge_attention(const AttentionPart& a, const AttentionPart& b);

// The 2·cp chunks rank `rank` of `cp` holds: {rank, 2·cp − 1 − rank}. Throws fabric::Error
// unless cp >= 1 and 0 <= rank < cp.
std::vector<int64_t> load_balanced_chunks(int64_t cp, int64_t rank);

// T / (2·cp), the length of one chunk. Throws fabric::Error naming T, cp and the nearest valid
// lengths when T is not a positive multiple of 2·cp.
int64_t cp_chunk_size(int64_t T, int64_t cp);

// The global positions of rank `rank`'s tokens, in its local order (its first chunk, then its
// second): the rows of the sequence it holds. Same errors as cp_chunk_size and
// load_balanced_chunks.
std::vector<int64_t> cp_rank_positions(int64_t T, int64_t cp, int64_t rank);

// The visible (query, key) pairs of a causal block: [Tq, Tk] bool, true where key k_offset + j <=
// query q_offset + i. What attention_part masks with under AttentionMask::kCausal.
torch::Tensor causal_visible(int64_t q_offset, int64_t Tq, int64_t k_offset, int64_t Tk,
                             const torch::Device& device = torch::kCPU);

// Attention of q [B, H, T, D] over k, v [B, Hk, T, D] (causal or not) computed as cp ranks of a
// ring would compute it: each rank holds the load-balanced chunks of q, k and v; at step s =
// 0..cp−1 rank r attends its queries to the key/value chunks of rank (r − s) mod cp, which it
// holds at that step, and merges the parts; then the keys and values move one rank on. The output
// [B, H, T, D] is reassembled in the original order, in q's dtype. Equals
// at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, scale, Hk != H) up to float32
// rounding, gradients included. Throws fabric::Error when T is not a multiple of 2·cp or the
// shapes do not fit.
torch::Tensor ring_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, int64_t cp, bool causal,
                                       std::optional<double> scale = std::nullopt);

}  // namespace fabric::nn

#endif  // FABRIC_NN_RING_ATTENTION_H_
