// Context parallelism's ring attention across processes (issue 71): each rank of a cp group holds
// its load-balanced share of the sequence (chunks r and 2·cp − 1 − r of 2·cp, cp_rank_positions'
// order) and gets the attention of its queries over the whole sequence. Its keys and values travel
// around the ring (rank r sends to r + 1 and receives from r − 1) with c10d send/recv, the next
// block's transfer posted before the current block is computed so that communication overlaps
// compute; the partial attentions merge exactly by their log-sum-exps. The backward is a custom
// autograd function, not autograd through communication: it recomputes each block's probabilities
// from the saved output and log-sum-exp (flash-attention style), keeps dQ on the rank, and lets the
// dK/dV accumulators travel with their key/value blocks so that each ends at its owner.
//
// The one-process math (attention_part, merge_attention, the split, ring_attention_reference) is
// in ring_attention.h, which stays free of communication; this target adds c10d.
//
// REQUIRES: every rank of `cp_group` calls ring_attention with the same shapes, causal, scale and
// kernel, in the same order as its other collectives and send/recv on that group (a rank that does
// not call it leaves the others waiting until the group's timeout), and runs the backward too if
// any rank does. CPU tensors need a group with a CPU backend (Gloo), CUDA tensors one with a CUDA
// backend.
// Thread-safety: one call at a time per group; calls on different groups may run concurrently.
#ifndef FABRIC_NN_RING_ATTENTION_DIST_H_
#define FABRIC_NN_RING_ATTENTION_DIST_H_

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include <optional>

namespace c10d {
class ProcessGroup;
}  // namespace c10d

namespace fabric::nn {

// What computes each (query chunk, key/value block) part, forward and backward. kAuto: on CPU,
// ATen's fused flash-attention kernels (_scaled_dot_product_flash_attention_for_cpu and its
// backward: tiled, the scores never materialized, the lse returned); on other devices kMatmul.
// kMatmul: scores, softmax and products in plain torch operations (any device; the scores of one
// part materialized). Both give the same values to float32 rounding; the tests run both.
enum class RingAttentionKernel { kAuto, kMatmul };

// This rank's rows of the attention of the whole sequence: q [B, H, Tl, D] and k, v
// [B, Hk, Tl, D] are the rank's local tokens in cp_rank_positions(T, cp, rank) order, with
// T = Tl · cp, cp = cp_group->getSize() and rank = cp_group->getRank(); the result [B, H, Tl, D]
// is in the same order and in q's dtype (computed in float32). causal: the query at global
// position i sees the keys at positions <= i; otherwise every key. scale multiplies the scores
// (1/sqrt(D) when unset, as SDPA). Grouped-query attention as ring_attention_reference: Hk divides
// H and query head h reads key/value head h / (H / Hk). Differentiable in q, k and v (the backward
// runs the ring again, once, on the same group). Rows that see no key give 0, never NaN.
// Equals the rows of at::scaled_dot_product_attention on the whole sequence up to float32
// rounding, gradients included.
// Throws fabric::Error when the shapes do not fit (not 4-d, k and v differ, batch, tokens or
// head_dim differ between q and k/v, Hk does not divide H) or when T = Tl · cp is not a multiple
// of 2·cp (the message names T, cp and the nearest valid lengths, as cp_chunk_size); every rank
// throws before communicating, since the shapes are the same on all. A failed send/recv (a peer
// gone, the group's timeout) throws fabric::Error naming the step.
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const c10::intrusive_ptr<c10d::ProcessGroup>& cp_group, bool causal,
                             std::optional<double> scale = std::nullopt,
                             RingAttentionKernel kernel = RingAttentionKernel::kAuto);

}  // namespace fabric::nn

#endif  // FABRIC_NN_RING_ATTENTION_DIST_H_
