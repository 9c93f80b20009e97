#include "fabric/nn/ring_attention.h"

#include <torch/types.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "fabric/core/error.h"

namespace fabric::nn {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Checks q [B, H, Tq, D] and k, v [B, Hk, Tk, D] with Hk dividing H.
void check_shapes(const char* what, const torch::Tensor& q, const torch::Tensor& k,
                  const torch::Tensor& v) {
  const std::string shapes =
      std::string(what) + ": q " + shape_of(q) + ", k " + shape_of(k) + ", v " + shape_of(v);
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    throw Error(shapes + " are not all 4-d; pass [batch, heads, tokens, head_dim] tensors");
  }
  if (k.sizes() != v.sizes()) throw Error(shapes + ": k and v differ; give them one shape");
  if (q.size(0) != k.size(0) || q.size(3) != k.size(3)) {
    throw Error(shapes + ": batch or head_dim differ between q and k/v; give them the same");
  }
  if (k.size(1) < 1 || q.size(1) % k.size(1) != 0) {
    throw Error(shapes + ": " + std::to_string(k.size(1)) + " key/value heads do not divide " +
                std::to_string(q.size(1)) +
                " query heads; use a key/value head count that divides the query heads "
                "(grouped-query attention)");
  }
}

// where(cond, x, fill): the gradient reaches x only where cond holds, so an inf or NaN derivative
// of the discarded branch never leaks into the backward.
torch::Tensor safe_where(const torch::Tensor& cond, const torch::Tensor& x, double fill) {
  return torch::where(cond, x, torch::full({}, fill, x.options()));
}

}  // namespace

torch::Tensor causal_visible(int64_t q_offset, int64_t Tq, int64_t k_offset, int64_t Tk,
                             const torch::Device& device) {
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  const torch::Tensor qpos = torch::arange(q_offset, q_offset + Tq, opts).view({Tq, 1});
  const torch::Tensor kpos = torch::arange(k_offset, k_offset + Tk, opts).view({1, Tk});
  return kpos <= qpos;
}

AttentionPart attention_part(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             AttentionMask mask, int64_t q_offset, int64_t k_offset,
                             std::optional<double> scale) {
  check_shapes("attention_part", q, k, v);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t Hk = k.size(1), Tk = k.size(2), G = H / Hk;
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(D)));
  // The G query heads sharing a key/value head side by side: [B, Hk, G, Tq, D] against
  // [B, Hk, 1, Tk, D] (repeat_kv by broadcasting, no copy).
  const torch::Tensor qg = q.to(torch::kFloat).reshape({B, Hk, G, Tq, D});
  const torch::Tensor kf = k.to(torch::kFloat).unsqueeze(2), vf = v.to(torch::kFloat).unsqueeze(2);
  torch::Tensor scores = torch::matmul(qg, kf.transpose(-1, -2)) * s;  // [B, Hk, G, Tq, Tk]
  if (mask == AttentionMask::kCausal) {
    const torch::Tensor visible = causal_visible(q_offset, Tq, k_offset, Tk, q.device());
    scores = scores.masked_fill(visible.logical_not(), -kInf);
  }
  // Softmax with the row maximum taken out (a constant for autograd: it cancels exactly); a row
  // with no visible key has maximum −inf, replaced by 0 so that exp gives 0, never NaN.
  const torch::Tensor row_max = std::get<0>(scores.detach().max(-1, /*keepdim=*/true));
  const torch::Tensor shift = safe_where(row_max.isfinite(), row_max, 0.0);
  const torch::Tensor e = torch::exp(scores - shift);  // 0 where masked
  const torch::Tensor denom = e.sum(-1, /*keepdim=*/true);
  const torch::Tensor seen = denom > 0;
  const torch::Tensor denom_safe = safe_where(seen, denom, 1.0);
  const torch::Tensor out = torch::matmul(e, vf) / denom_safe;  // rows that saw nothing: 0
  const torch::Tensor lse = safe_where(seen, torch::log(denom_safe) + shift, -kInf);
  return {out.reshape({B, H, Tq, D}), lse.reshape({B, H, Tq})};
}

AttentionPart merge_attention(const AttentionPart& a, const AttentionPart& b) {
  if (!a.out.defined()) return b;
  if (!b.out.defined()) return a;
  // Both weights relative to the larger lse (a constant for autograd: it cancels exactly), so the
  // exponentials are <= 1; where both sides are −inf the reference is 0 and both weights are 0.
  const torch::Tensor larger = torch::maximum(a.lse, b.lse).detach();
  const torch::Tensor ref = safe_where(larger.isfinite(), larger, 0.0);
  const torch::Tensor wa = torch::exp(a.lse - ref), wb = torch::exp(b.lse - ref);
  const torch::Tensor total = wa + wb;
  const torch::Tensor seen = total > 0;
  const torch::Tensor total_safe = safe_where(seen, total, 1.0);
  // wa / total = exp(a.lse − lse) with lse = log(total) + ref.
  const torch::Tensor lse = safe_where(seen, torch::log(total_safe) + ref, -kInf);
  const torch::Tensor out =
      a.out * (wa / total_safe).unsqueeze(-1) + b.out * (wb / total_safe).unsqueeze(-1);
  return {out, lse};
}

std::vector<int64_t> load_balanced_chunks(int64_t cp, int64_t rank) {
  if (cp < 1 || rank < 0 || rank >= cp) {
    throw Error("load_balanced_chunks: rank " + std::to_string(rank) + " of cp=" +
                std::to_string(cp) + " is out of range; need cp >= 1 and 0 <= rank < cp");
  }
  return {rank, 2 * cp - 1 - rank};
}

int64_t cp_chunk_size(int64_t T, int64_t cp) {
  if (cp < 1) {
    throw Error("context parallelism: cp=" + std::to_string(cp) + " ranks; cp must be >= 1");
  }
  const int64_t m = 2 * cp;
  if (T <= 0 || T % m != 0) {
    const int64_t below = T > 0 ? T / m * m : 0, above = T > 0 ? below + m : m;
    const std::string nearest =
        below > 0 ? "T=" + std::to_string(below) + " or T=" + std::to_string(above)
                  : "T=" + std::to_string(above);
    throw Error("context parallelism: sequence length T=" + std::to_string(T) +
                " is not a positive multiple of 2*cp=" + std::to_string(m) +
                " (cp=" + std::to_string(cp) + ", 2 chunks per rank); pad or cut the sequence to " +
                nearest + ", or pick a cp with 2*cp dividing T");
  }
  return T / m;
}

std::vector<int64_t> cp_rank_positions(int64_t T, int64_t cp, int64_t rank) {
  const int64_t c = cp_chunk_size(T, cp);
  std::vector<int64_t> positions;
  positions.reserve(2 * c);
  for (int64_t chunk : load_balanced_chunks(cp, rank)) {
    for (int64_t i = 0; i < c; ++i) positions.push_back(chunk * c + i);
  }
  return positions;
}

torch::Tensor ring_attention_reference(const torch::Tensor& q, const torch::Tensor& k,
                                       const torch::Tensor& v, int64_t cp, bool causal,
                                       std::optional<double> scale) {
  check_shapes("ring_attention_reference", q, k, v);
  const int64_t T = q.size(2);
  if (k.size(2) != T) {
    throw Error("ring_attention_reference: q has " + std::to_string(T) + " tokens, k/v " +
                std::to_string(k.size(2)) + "; self-attention needs the same sequence for both");
  }
  const int64_t c = cp_chunk_size(T, cp);

  // What a rank holds: its two chunks' queries (fixed), and the key/value chunks that travel.
  struct Chunk {
    int64_t offset;  // the global position of its first token
    torch::Tensor q;
  };
  struct KVBlock {
    int64_t offset;
    torch::Tensor k, v;
  };
  std::vector<std::vector<Chunk>> queries(cp);
  std::vector<std::vector<KVBlock>> held(cp);  // held[r]: the key/value chunks rank r has now
  for (int64_t r = 0; r < cp; ++r) {
    for (int64_t chunk : load_balanced_chunks(cp, r)) {
      const int64_t offset = chunk * c;
      queries[r].push_back({offset, q.narrow(2, offset, c)});
      held[r].push_back({offset, k.narrow(2, offset, c), v.narrow(2, offset, c)});
    }
  }
  // parts[r][i]: rank r's running attention for its i-th query chunk (empty until merged into).
  std::vector<std::vector<AttentionPart>> parts(cp, std::vector<AttentionPart>(2));

  for (int64_t step = 0; step < cp; ++step) {
    // Compute: every rank against the key/value chunks it holds, those of rank (r − step) mod cp.
    for (int64_t r = 0; r < cp; ++r) {
      for (size_t i = 0; i < queries[r].size(); ++i) {
        const Chunk& qc = queries[r][i];
        for (const KVBlock& kv : held[r]) {
          AttentionMask mask = AttentionMask::kNone;
          if (causal) {
            if (kv.offset > qc.offset + c - 1) continue;  // all keys in the future: nothing seen
            if (kv.offset + c - 1 > qc.offset) mask = AttentionMask::kCausal;  // the diagonal
          }
          parts[r][i] = merge_attention(
              parts[r][i], attention_part(qc.q, kv.k, kv.v, mask, qc.offset, kv.offset, scale));
        }
      }
    }
    // Communicate: rank r sends what it holds to rank r + 1 and receives rank r − 1's (the
    // distributed version: send/recv, overlapped with the next step's compute). Not after the last.
    if (step + 1 < cp) {
      std::vector<std::vector<KVBlock>> next(cp);
      for (int64_t r = 0; r < cp; ++r) next[r] = held[(r - 1 + cp) % cp];
      held = std::move(next);
    }
  }

  // Reassemble: chunk j of the sequence is the output of whichever rank holds it.
  std::vector<torch::Tensor> outputs(2 * cp);
  for (int64_t r = 0; r < cp; ++r) {
    for (size_t i = 0; i < queries[r].size(); ++i)
      outputs[queries[r][i].offset / c] = parts[r][i].out;
  }
  return torch::cat(outputs, 2).to(q.scalar_type());
}

}  // namespace fabric::nn
