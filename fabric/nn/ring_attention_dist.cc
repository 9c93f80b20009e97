#include "fabric/nn/ring_attention_dist.h"

#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <torch/autograd.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/ring_attention.h"

namespace fabric::nn {

namespace {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

constexpr double kInf = std::numeric_limits<double>::infinity();

std::string shape_of(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

// Checks q [B, H, Tl, D] and k, v [B, Hk, Tl, D] with Hk dividing H, and that T = Tl · cp splits
// into 2·cp chunks; returns the chunk length T / (2·cp) = Tl / 2.
int64_t check_inputs(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     int64_t cp) {
  const std::string shapes =
      "ring_attention: q " + shape_of(q) + ", k " + shape_of(k) + ", v " + shape_of(v);
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    throw Error(shapes + " are not all 4-d; pass [batch, heads, local tokens, head_dim] tensors");
  }
  if (k.sizes() != v.sizes()) throw Error(shapes + ": k and v differ; give them one shape");
  if (q.size(0) != k.size(0) || q.size(2) != k.size(2) || q.size(3) != k.size(3)) {
    throw Error(shapes +
                ": batch, local tokens or head_dim differ between q and k/v; give them the same "
                "(each rank passes the same local tokens of q, k and v)");
  }
  if (k.size(1) < 1 || q.size(1) % k.size(1) != 0) {
    throw Error(shapes + ": " + std::to_string(k.size(1)) + " key/value heads do not divide " +
                std::to_string(q.size(1)) +
                " query heads; use a key/value head count that divides the query heads "
                "(grouped-query attention)");
  }
  const int64_t Tl = q.size(2);
  try {
    return cp_chunk_size(Tl * cp, cp);
  } catch (const Error& e) {
    throw Error("ring_attention: " + std::to_string(Tl) +
                " local tokens per rank x cp=" + std::to_string(cp) + " ranks: " + e.what());
  }
}

// The ring as this rank sees it.
struct Ring {
  Ring(ProcessGroupPtr g, const torch::Device& device)
      : group(std::move(g)),
        cp(group->getSize()),
        rank(group->getRank()),
        host_wire(distributed::sends_through_host(*group, device)) {}
  ProcessGroupPtr group;
  int64_t cp = 1, rank = 0;
  // CUDA blocks travel through host memory when the ranks share one GPU over Gloo.
  bool host_wire = false;
  // A receive buffer shaped as `like`: on the host when the wire is.
  torch::Tensor buffer_like(const torch::Tensor& like) const {
    return host_wire ? torch::empty(like.sizes(), like.options().device(torch::kCPU))
                     : torch::empty_like(like);
  }
  int next() const { return static_cast<int>((rank + 1) % cp); }
  int prev() const { return static_cast<int>((rank - 1 + cp) % cp); }
  // Whose block rank `rank` holds at `step`: (rank − step) mod cp.
  int64_t holder_of(int64_t step) const { return (rank - step + cp) % cp; }
};

WorkPtr post_send(const Ring& ring, const torch::Tensor& t, int tag) {
  std::vector<torch::Tensor> ts{distributed::wire_tensor(t, ring.host_wire)};  // the work holds it
  return ring.group->send(ts, ring.next(), tag);
}

WorkPtr post_recv(const Ring& ring, const torch::Tensor& t, int tag) {
  std::vector<torch::Tensor> ts{t};
  return ring.group->recv(ts, ring.prev(), tag);
}

std::string what_of(const char* pass, int64_t step, const Ring& ring, const char* what) {
  return std::string("ring_attention ") + pass + " step " + std::to_string(step + 1) + " of " +
         std::to_string(ring.cp) + ": " + what + " (rank " + std::to_string(ring.rank) +
         " sends to " + std::to_string(ring.next()) + ", receives from " +
         std::to_string(ring.prev()) + ")";
}

// A part of a held key/value block that some of a rank's local queries see: query rows
// [q_begin, q_begin + q_len) against block rows [k_begin, k_begin + k_len), all visible, or, when
// `diagonal`, one chunk against the same chunk of the sequence (q_len = k_len = c, query i sees
// keys 0..i: causal aligned at the top left, as SDPA's is_causal). Row sets are whole chunks (the
// first, the second or both, so contiguous). Chunks are aligned, so a causal pair of chunks is
// either entirely visible, entirely in the future, or the diagonal.
struct BlockPlan {
  int64_t q_begin = 0, q_len = 0, k_begin = 0, k_len = 0;
  bool diagonal = false;
};

// The parts of a held block (kv_rank's chunks) that rank q_rank's queries see: per query chunk,
// the key chunks it sees wholly (one range) and its diagonal; chunks entirely in its future cost
// nothing. Both query chunks seeing the same keys wholly make one part. Empty: nothing seen.
std::vector<BlockPlan> plan_block(int64_t cp, int64_t c, int64_t q_rank, int64_t kv_rank,
                                  bool causal) {
  const std::vector<int64_t> qc = load_balanced_chunks(cp, q_rank);
  const std::vector<int64_t> kc = load_balanced_chunks(cp, kv_rank);
  std::vector<BlockPlan> plans;
  for (int64_t i = 0; i < 2; ++i) {
    bool whole[2] = {false, false};
    for (int64_t j = 0; j < 2; ++j) {
      if (causal && kc[j] == qc[i]) {
        plans.push_back({i * c, c, j * c, c, /*diagonal=*/true});
      } else {
        whole[j] = !causal || kc[j] < qc[i];
      }
    }
    if (!whole[0] && !whole[1]) continue;
    const BlockPlan p{i * c, c, whole[0] ? 0 : c, (whole[0] + whole[1]) * c, false};
    auto same_keys = [&](const BlockPlan& o) {
      return !o.diagonal && o.k_begin == p.k_begin && o.k_len == p.k_len &&
             o.q_begin + o.q_len == p.q_begin;
    };
    if (!plans.empty() && same_keys(plans.back())) {
      plans.back().q_len += c;  // rows 0 .. 2c against the same keys: one product
    } else {
      plans.push_back(p);
    }
  }
  return plans;
}

// A plan's tensors: the queries (and the upstream gradient, the output, the lse in the backward)
// narrowed to its rows, the held block's keys and values to its rows.
torch::Tensor rows(const torch::Tensor& t, const BlockPlan& p) {
  return t.narrow(2, p.q_begin, p.q_len);
}
torch::Tensor keys(const torch::Tensor& kv, const BlockPlan& p) {
  return kv.select(0, 0).narrow(2, p.k_begin, p.k_len);
}
torch::Tensor values(const torch::Tensor& kv, const BlockPlan& p) {
  return kv.select(0, 1).narrow(2, p.k_begin, p.k_len);
}

// [c, c] true above the diagonal: the pairs a diagonal part hides.
torch::Tensor above_diagonal(int64_t c, const torch::Device& device) {
  return torch::ones({c, c}, torch::TensorOptions().dtype(torch::kBool).device(device)).triu(1);
}

// The grouped view [B, Hk, G, T, ·] of [B, H, T, ·]: the G query heads of each key/value head.
torch::Tensor grouped(const torch::Tensor& t, int64_t Hk) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] /= Hk;
  shape.insert(shape.begin() + 1, Hk);
  return t.reshape(shape);
}

// One part of the forward: its output [B, H, q_len, D] (normalized over its own keys) and lse
// [B, H, q_len]. kFused: ATen's CPU flash-attention kernel, which returns the lse and reads
// grouped key/value heads directly. Otherwise scores, softmax and product in torch operations.
std::pair<torch::Tensor, torch::Tensor> forward_part(const torch::Tensor& q,
                                                     const torch::Tensor& kv, const BlockPlan& p,
                                                     double scale, bool fused) {
  const torch::Tensor qs = rows(q, p), ks = keys(kv, p), vs = values(kv, p);
  if (fused) {
    auto [o, l] =
        at::_scaled_dot_product_flash_attention_for_cpu(qs, ks, vs, 0.0, p.diagonal, {}, scale);
    return {o, l};
  }
  const int64_t Hk = ks.size(1);
  torch::Tensor s = torch::matmul(grouped(qs, Hk), ks.unsqueeze(2).transpose(-1, -2)).mul_(scale);
  if (p.diagonal) s.masked_fill_(above_diagonal(p.q_len, q.device()), -kInf);
  // Every row of a part sees at least one key (the diagonal's first), so the maximum is finite.
  const torch::Tensor m = std::get<0>(s.max(-1, /*keepdim=*/true));
  const torch::Tensor e = s.sub_(m).exp_();
  const torch::Tensor sum = e.sum(-1, /*keepdim=*/true);
  const torch::Tensor out = torch::matmul(e, vs.unsqueeze(2)).div_(sum);
  return {out.flatten(1, 2), (sum.log_() + m).squeeze(-1).flatten(1, 2)};
}

// Merges a part (o, l) into the running attention of its rows (out [B, H, Tl, D], lse [B, H, Tl],
// normalized): lse' = log(exp(lse) + exp(l)), out' = out·exp(lse − lse') + o·exp(l − lse'). Both
// weights relative to the larger lse; a row that has seen nothing yet (lse −inf) takes the part.
void merge_part(const BlockPlan& p, const torch::Tensor& o, const torch::Tensor& l,
                torch::Tensor& out, torch::Tensor& lse) {
  torch::Tensor lse_rows = rows(lse, p), out_rows = rows(out, p);
  const torch::Tensor larger = torch::maximum(lse_rows, l);
  const torch::Tensor ref = torch::where(larger.isfinite(), larger, torch::zeros({}, l.options()));
  const torch::Tensor wa = (lse_rows - ref).exp_(), wb = (l - ref).exp_();
  const torch::Tensor total = wa + wb;
  const torch::Tensor seen = total > 0;
  const torch::Tensor total_safe = torch::where(seen, total, torch::ones({}, total.options()));
  out_rows.mul_((wa / total_safe).unsqueeze(-1)).add_(o * (wb / total_safe).unsqueeze(-1));
  lse_rows.copy_(torch::where(seen, total_safe.log() + ref, torch::full({}, -kInf, l.options())));
}

// One part of the backward, with the whole attention's out and lse (so that P = exp(S·scale −
// lse) are the final probabilities): adds its dQ to dq [B, H, Tl, D] and its dK, dV to dkv
// [2, B, Hk, Tl, D]. kFused: ATen's CPU flash-attention backward. Otherwise: delta = rowsum(dO·O),
// dV += Pᵀ·dO, dS = P·(dO·Vᵀ − delta), dQ += dS·K·scale, dK += dSᵀ·Q·scale (dK, dV summed over
// the G query heads of a key/value head).
void backward_part(const torch::Tensor& q, const torch::Tensor& dout, const torch::Tensor& out,
                   const torch::Tensor& lse, const torch::Tensor& delta, const torch::Tensor& kv,
                   const BlockPlan& p, double scale, bool fused, torch::Tensor& dq,
                   torch::Tensor& dkv) {
  const torch::Tensor qs = rows(q, p), dos = rows(dout, p), ks = keys(kv, p), vs = values(kv, p);
  torch::Tensor dk = dkv.select(0, 0).narrow(2, p.k_begin, p.k_len);
  torch::Tensor dv = dkv.select(0, 1).narrow(2, p.k_begin, p.k_len);
  if (fused) {
    const auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        dos, qs, ks, vs, rows(out, p), rows(lse, p), 0.0, p.diagonal, {}, scale);
    rows(dq, p).add_(gq);
    dk.add_(gk);
    dv.add_(gv);
    return;
  }
  const int64_t Hk = ks.size(1);
  const torch::Tensor qg = grouped(qs, Hk), dog = grouped(dos, Hk);
  const torch::Tensor kg = ks.unsqueeze(2), vg = vs.unsqueeze(2);
  torch::Tensor prob = torch::matmul(qg, kg.transpose(-1, -2)).mul_(scale);
  if (p.diagonal) prob.masked_fill_(above_diagonal(p.q_len, q.device()), -kInf);
  prob.sub_(grouped(rows(lse, p), Hk).unsqueeze(-1)).exp_();  // hidden pairs: exp(−inf) = 0
  dv.add_(torch::matmul(prob.transpose(-1, -2), dog).sum(2));
  torch::Tensor ds = torch::matmul(dog, vg.transpose(-1, -2));    // dP
  ds.sub_(grouped(rows(delta, p), Hk).unsqueeze(-1)).mul_(prob);  // dS
  rows(dq, p).add_(torch::matmul(ds, kg).flatten(1, 2), scale);
  dk.add_(torch::matmul(ds.transpose(-1, -2), qg).sum(2), scale);
}

// One step's move of the held key/value block to the next rank (none at the last step): posted
// at construction, waited for by finish(), which returns the block to hold next.
struct KeyValueHop {
  KeyValueHop(const Ring& ring_, const torch::Tensor& held, int64_t step_)
      : ring(ring_), step(step_) {
    if (step + 1 >= ring.cp) return;
    incoming = ring.buffer_like(held);
    send = post_send(ring, held, static_cast<int>(step));
    recv = post_recv(ring, incoming, static_cast<int>(step));
  }
  torch::Tensor finish(const char* pass, const torch::Tensor& held) {
    if (!send) return held;
    distributed::wait(send, what_of(pass, step, ring, "send of the key/value block"));
    distributed::wait(recv, what_of(pass, step, ring, "receive of the key/value block"));
    return incoming.to(held.device());
  }
  const Ring& ring;
  int64_t step;
  WorkPtr send, recv;
  torch::Tensor incoming;
};

// The forward ring: out [B, H, Tl, D] and lse [B, H, Tl], float32.
std::pair<torch::Tensor, torch::Tensor> ring_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v, const Ring& ring,
                                                     bool causal, double scale, bool fused) {
  const int64_t B = q.size(0), H = q.size(1), Tl = q.size(2), D = q.size(3), c = Tl / 2;
  const torch::Tensor qf = q.to(torch::kFloat);
  torch::Tensor held = torch::stack({k.to(torch::kFloat), v.to(torch::kFloat)}).contiguous();
  torch::Tensor out = torch::zeros({B, H, Tl, D}, qf.options());
  torch::Tensor lse = torch::full({B, H, Tl}, -kInf, qf.options());
  for (int64_t step = 0; step < ring.cp; ++step) {
    KeyValueHop hop(ring, held, step);  // posted first: it overlaps this block's compute
    for (const BlockPlan& p : plan_block(ring.cp, c, ring.rank, ring.holder_of(step), causal)) {
      const auto [o, l] = forward_part(qf, held, p, scale, fused);
      merge_part(p, o, l, out, lse);
    }
    held = hop.finish("forward", held);
  }
  return {out, lse};
}

struct Grads {
  torch::Tensor dq, dk, dv;  // float32
};

// The backward ring. The key/value blocks travel as in the forward; each block's dK/dV
// accumulator travels behind it (sent once this rank has added its share) and, after cp hops,
// arrives at the block's owner.
Grads ring_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const torch::Tensor& out, const torch::Tensor& lse, const torch::Tensor& dout,
                    const Ring& ring, bool causal, double scale, bool fused) {
  const int64_t c = q.size(2) / 2;
  const torch::Tensor qf = q.to(torch::kFloat), dof = dout.to(torch::kFloat);
  // rowsum(dO·O), for the torch-operations path (the fused kernel computes its own).
  const torch::Tensor delta = fused ? torch::Tensor() : (dof * out).sum(-1);
  torch::Tensor dq = torch::zeros_like(qf);
  torch::Tensor held = torch::stack({k.to(torch::kFloat), v.to(torch::kFloat)}).contiguous();
  torch::Tensor dkv, grad_in, grad_out;
  WorkPtr grad_send, grad_recv;
  const int grad_tag = static_cast<int>(ring.cp);  // grad tags cp .. 2·cp − 1, after the kv tags
  for (int64_t step = 0; step < ring.cp; ++step) {
    KeyValueHop hop(ring, held, step);
    dkv = torch::zeros_like(held);  // this rank's share of the held block's dK, dV
    for (const BlockPlan& p : plan_block(ring.cp, c, ring.rank, ring.holder_of(step), causal))
      backward_part(qf, dof, out, lse, delta, held, p, scale, fused, dq, dkv);
    if (ring.cp > 1) {
      if (step > 0) {
        distributed::wait(grad_recv, what_of("backward", step, ring, "receive of dK/dV"));
        dkv.add_(grad_in.to(dkv.device()));  // the shares of the ranks the block visited before
        distributed::wait(grad_send, what_of("backward", step, ring, "send of dK/dV"));
      }
      grad_out = dkv;
      grad_send = post_send(ring, grad_out, grad_tag + static_cast<int>(step));
      grad_in = ring.buffer_like(held);
      grad_recv = post_recv(ring, grad_in, grad_tag + static_cast<int>(step));
    }
    held = hop.finish("backward", held);
  }
  if (ring.cp > 1) {  // the last hop: every block's dK/dV reaches its owner
    distributed::wait(grad_send, what_of("backward", ring.cp - 1, ring, "send of dK/dV home"));
    distributed::wait(grad_recv, what_of("backward", ring.cp - 1, ring, "receive of own dK/dV"));
    dkv = grad_in.to(held.device());
  }
  return {dq, dkv.select(0, 0), dkv.select(0, 1)};
}

// The group travels through the autograd context as a capsule (a counted reference): a backward
// run after the caller dropped its pointer still has the group.
struct RingAttentionFunction : torch::autograd::Function<RingAttentionFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const ProcessGroupPtr& group, bool causal, double scale,
                               bool fused) {
    const Ring ring(group, q.device());
    auto [out, lse] = ring_forward(q, k, v, ring, causal, scale, fused);
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["group"] = c10::IValue::make_capsule(group);
    ctx->saved_data["causal"] = causal;
    ctx->saved_data["scale"] = scale;
    torch::Tensor result = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse});
    return result;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const ProcessGroupPtr group = c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(
        ctx->saved_data["group"].toCapsule());
    const Ring ring(group, q.device());
    const Grads g = ring_backward(
        q, k, v, saved[3], saved[4], grads[0], ring, ctx->saved_data["causal"].toBool(),
        ctx->saved_data["scale"].toDouble(), ctx->saved_data["fused"].toBool());
    // None for the group, causal, scale and fused.
    return {g.dq.to(q.scalar_type()), g.dk.to(k.scalar_type()), g.dv.to(v.scalar_type()),
            torch::Tensor(),          torch::Tensor(),          torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const ProcessGroupPtr& cp_group, bool causal,
                             std::optional<double> scale, RingAttentionKernel kernel) {
  if (!cp_group) {
    throw Error(
        "ring_attention: the cp group is null; pass the process group of the ranks that "
        "share the sequence");
  }
  check_inputs(q, k, v, cp_group->getSize());
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  const bool fused = kernel == RingAttentionKernel::kAuto && q.device().is_cpu();
  return RingAttentionFunction::apply(q, k, v, cp_group, causal, s, fused);
}

}  // namespace fabric::nn
