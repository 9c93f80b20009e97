#include "fabric/nn/ring_attention_dist.h"

#include <torch/torch.h>
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
  ProcessGroupPtr group;
  int64_t cp = 1, rank = 0;
  int next() const { return static_cast<int>((rank + 1) % cp); }
  int prev() const { return static_cast<int>((rank - 1 + cp) % cp); }
  // Whose block rank `rank` holds at `step`: (rank − step) mod cp.
  int64_t holder_of(int64_t step) const { return (rank - step + cp) % cp; }
};

WorkPtr post_send(const Ring& ring, const torch::Tensor& t, int tag) {
  std::vector<torch::Tensor> ts{t};
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

// Which of a rank's local queries see which rows of a held key/value block: query rows
// [q_begin, q_begin + q_len) against block rows [k_begin, k_begin + k_len), with `masked`
// [q_len, k_len] true for the pairs a causal mask hides (undefined: none hidden). Both row sets
// are whole chunks of c rows (the first, the second or both, so contiguous).
struct BlockPlan {
  int64_t q_begin = 0, q_len = 0, k_begin = 0, k_len = 0;
  torch::Tensor masked;
};

// The parts of a held block (kv_rank's chunks) that rank q_rank's queries see: one plan per query
// chunk that sees any of it (so a chunk's keys entirely in its future cost nothing), merged into
// one when both query chunks see the same keys wholly (no mask). Empty: nothing seen.
std::vector<BlockPlan> plan_block(int64_t cp, int64_t c, int64_t q_rank, int64_t kv_rank,
                                  bool causal, const torch::Device& device) {
  const std::vector<int64_t> qc = load_balanced_chunks(cp, q_rank);
  const std::vector<int64_t> kc = load_balanced_chunks(cp, kv_rank);
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  std::vector<BlockPlan> plans;
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t qo = qc[i] * c;
    bool col[2] = {false, false}, partial = false;
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t ko = kc[j] * c;
      if (causal && ko > qo + c - 1) continue;  // every key after every query: nothing seen
      col[j] = true;
      partial = partial || (causal && ko + c - 1 > qo);  // the diagonal
    }
    if (!col[0] && !col[1]) continue;
    BlockPlan p;
    p.q_begin = i * c;
    p.q_len = c;
    p.k_begin = col[0] ? 0 : c;
    p.k_len = (col[0] + col[1]) * c;
    if (partial) {
      std::vector<torch::Tensor> kpos;
      for (int64_t j = 0; j < 2; ++j) {
        if (col[j]) kpos.push_back(torch::arange(kc[j] * c, kc[j] * c + c, opts));
      }
      const torch::Tensor qpos = torch::arange(qo, qo + c, opts);
      p.masked = torch::cat(kpos).view({1, -1}) > qpos.view({-1, 1});
    }
    if (!plans.empty() && !p.masked.defined() && !plans.back().masked.defined() &&
        plans.back().k_begin == p.k_begin && plans.back().k_len == p.k_len) {
      plans.back().q_len += c;  // rows 0 .. 2c against the same keys: one product
    } else {
      plans.push_back(std::move(p));
    }
  }
  return plans;
}

// One block of the forward by online softmax: the rank's grouped queries qg [B, Hk, G, Tl, D]
// against the held block kv [2, B, Hk, Tl, D] (keys, values), into the running state: acc
// (unnormalized outputs), row_max and row_sum [B, Hk, G, Tl, 1]. A row that has seen nothing keeps
// row_max −inf; its shift is 0 so that every exponential is exp(−inf) = 0, never NaN.
void forward_block(const torch::Tensor& qg, const torch::Tensor& kv, const BlockPlan& p,
                   double scale, torch::Tensor& acc, torch::Tensor& row_max,
                   torch::Tensor& row_sum) {
  const torch::Tensor qs = qg.narrow(3, p.q_begin, p.q_len);
  const torch::Tensor ks = kv.select(0, 0).narrow(2, p.k_begin, p.k_len).unsqueeze(2);
  const torch::Tensor vs = kv.select(0, 1).narrow(2, p.k_begin, p.k_len).unsqueeze(2);
  torch::Tensor s = torch::matmul(qs, ks.transpose(-1, -2)).mul_(scale);  // [B, Hk, G, q, k]
  if (p.masked.defined()) s.masked_fill_(p.masked, -kInf);
  torch::Tensor m_old = row_max.narrow(3, p.q_begin, p.q_len);
  const torch::Tensor m_new = torch::maximum(m_old, std::get<0>(s.max(-1, /*keepdim=*/true)));
  const torch::Tensor shift =
      torch::where(m_new.isfinite(), m_new, torch::zeros({}, m_new.options()));
  const torch::Tensor e = s.sub_(shift).exp_();
  const torch::Tensor alpha = (m_old - shift).exp_();  // 0 while the row had seen nothing
  row_sum.narrow(3, p.q_begin, p.q_len).mul_(alpha).add_(e.sum(-1, /*keepdim=*/true));
  acc.narrow(3, p.q_begin, p.q_len).mul_(alpha).add_(torch::matmul(e, vs));
  m_old.copy_(m_new);
}

// One block of the backward: with P = exp(S·scale − lse) recomputed from the saved lse, delta =
// rowsum(dO·O): dV += Pᵀ·dO, dS = P·(dO·Vᵀ − delta), dQ += dS·K·scale, dK += dSᵀ·Q·scale (dK and
// dV summed over the G query heads sharing a key/value head). dkv [2, B, Hk, Tl, D]: the block's
// dK and dV.
void backward_block(const torch::Tensor& qg, const torch::Tensor& dog, const torch::Tensor& delta,
                    const torch::Tensor& lse, const torch::Tensor& kv, const BlockPlan& p,
                    double scale, torch::Tensor& dq, torch::Tensor& dkv) {
  const torch::Tensor qs = qg.narrow(3, p.q_begin, p.q_len);
  const torch::Tensor dos = dog.narrow(3, p.q_begin, p.q_len);
  const torch::Tensor ks = kv.select(0, 0).narrow(2, p.k_begin, p.k_len).unsqueeze(2);
  const torch::Tensor vs = kv.select(0, 1).narrow(2, p.k_begin, p.k_len).unsqueeze(2);
  torch::Tensor prob = torch::matmul(qs, ks.transpose(-1, -2)).mul_(scale);
  if (p.masked.defined()) prob.masked_fill_(p.masked, -kInf);
  prob.sub_(lse.narrow(3, p.q_begin, p.q_len)).exp_();  // masked pairs: exp(−inf) = 0
  dkv.select(0, 1)
      .narrow(2, p.k_begin, p.k_len)
      .add_(torch::matmul(prob.transpose(-1, -2), dos).sum(2));
  torch::Tensor ds = torch::matmul(dos, vs.transpose(-1, -2));  // dP
  ds.sub_(delta.narrow(3, p.q_begin, p.q_len)).mul_(prob);      // dS
  dq.narrow(3, p.q_begin, p.q_len).add_(torch::matmul(ds, ks), scale);
  dkv.select(0, 0)
      .narrow(2, p.k_begin, p.k_len)
      .add_(torch::matmul(ds.transpose(-1, -2), qs).sum(2), scale);
}

// The forward ring: out [B, H, Tl, D] and lse [B, H, Tl], float32.
std::pair<torch::Tensor, torch::Tensor> ring_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                     const torch::Tensor& v, const Ring& ring,
                                                     bool causal, double scale) {
  const int64_t B = q.size(0), H = q.size(1), Tl = q.size(2), D = q.size(3), Hk = k.size(1);
  const int64_t G = H / Hk, c = Tl / 2;
  const torch::Tensor qg = q.to(torch::kFloat).reshape({B, Hk, G, Tl, D});
  torch::Tensor held = torch::stack({k.to(torch::kFloat), v.to(torch::kFloat)}).contiguous();
  torch::Tensor acc = torch::zeros({B, Hk, G, Tl, D}, qg.options());
  torch::Tensor row_max = torch::full({B, Hk, G, Tl, 1}, -kInf, qg.options());
  torch::Tensor row_sum = torch::zeros({B, Hk, G, Tl, 1}, qg.options());
  for (int64_t step = 0; step < ring.cp; ++step) {
    // The next block's transfer first, so that it overlaps this block's compute.
    WorkPtr send, recv;
    torch::Tensor incoming;
    if (step + 1 < ring.cp) {
      incoming = torch::empty_like(held);
      send = post_send(ring, held, static_cast<int>(step));
      recv = post_recv(ring, incoming, static_cast<int>(step));
    }
    for (const BlockPlan& p :
         plan_block(ring.cp, c, ring.rank, ring.holder_of(step), causal, q.device()))
      forward_block(qg, held, p, scale, acc, row_max, row_sum);
    if (send) {
      distributed::wait(send, what_of("forward", step, ring, "send of the key/value block"));
      distributed::wait(recv, what_of("forward", step, ring, "receive of the key/value block"));
      held = incoming;
    }
  }
  const torch::Tensor seen = row_sum > 0;
  const torch::Tensor out = acc / torch::where(seen, row_sum, torch::ones({}, row_sum.options()));
  const torch::Tensor lse =
      torch::where(seen, row_sum.log() + row_max, torch::full({}, -kInf, row_sum.options()));
  return {out.reshape({B, H, Tl, D}), lse.reshape({B, H, Tl})};
}

struct Grads {
  torch::Tensor dq, dk, dv;  // float32
};

// The backward ring. The key/value blocks travel as in the forward; each block's dK/dV
// accumulator travels behind it (sent once this rank has added its share) and, after cp hops,
// arrives at the block's owner.
Grads ring_backward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const torch::Tensor& out, const torch::Tensor& lse, const torch::Tensor& dout,
                    const Ring& ring, bool causal, double scale) {
  const int64_t B = q.size(0), H = q.size(1), Tl = q.size(2), D = q.size(3), Hk = k.size(1);
  const int64_t G = H / Hk, c = Tl / 2;
  const torch::Tensor qg = q.to(torch::kFloat).reshape({B, Hk, G, Tl, D});
  const torch::Tensor dog = dout.to(torch::kFloat).reshape({B, Hk, G, Tl, D});
  const torch::Tensor delta = (dog * out.reshape({B, Hk, G, Tl, D})).sum(-1, /*keepdim=*/true);
  // A row that saw no key (lse −inf) has every score masked: a shift of 0 keeps P at 0.
  const torch::Tensor lse_g = lse.reshape({B, Hk, G, Tl, 1});
  const torch::Tensor lse_safe =
      torch::where(lse_g.isfinite(), lse_g, torch::zeros({}, lse_g.options()));
  torch::Tensor dq = torch::zeros_like(qg);
  torch::Tensor held = torch::stack({k.to(torch::kFloat), v.to(torch::kFloat)}).contiguous();
  torch::Tensor dkv, grad_in, grad_out;
  WorkPtr grad_send, grad_recv;
  const int grad_tag = static_cast<int>(ring.cp);  // grad tags cp .. 2·cp − 1, after the kv tags
  for (int64_t step = 0; step < ring.cp; ++step) {
    WorkPtr send, recv;
    torch::Tensor incoming;
    if (step + 1 < ring.cp) {
      incoming = torch::empty_like(held);
      send = post_send(ring, held, static_cast<int>(step));
      recv = post_recv(ring, incoming, static_cast<int>(step));
    }
    dkv = torch::zeros_like(held);  // this rank's share of the held block's dK, dV
    for (const BlockPlan& p :
         plan_block(ring.cp, c, ring.rank, ring.holder_of(step), causal, q.device()))
      backward_block(qg, dog, delta, lse_safe, held, p, scale, dq, dkv);
    if (ring.cp > 1) {
      if (step > 0) {
        distributed::wait(grad_recv, what_of("backward", step, ring, "receive of dK/dV"));
        dkv.add_(grad_in);  // the shares of the ranks the block visited before
        distributed::wait(grad_send, what_of("backward", step, ring, "send of dK/dV"));
      }
      grad_out = dkv;
      grad_send = post_send(ring, grad_out, grad_tag + static_cast<int>(step));
      grad_in = torch::empty_like(held);
      grad_recv = post_recv(ring, grad_in, grad_tag + static_cast<int>(step));
    }
    if (send) {
      distributed::wait(send, what_of("backward", step, ring, "send of the key/value block"));
      distributed::wait(recv, what_of("backward", step, ring, "receive of the key/value block"));
      held = incoming;
    }
  }
  if (ring.cp > 1) {  // the last hop: every block's dK/dV reaches its owner
    distributed::wait(grad_send, what_of("backward", ring.cp - 1, ring, "send of dK/dV home"));
    distributed::wait(grad_recv, what_of("backward", ring.cp - 1, ring, "receive of own dK/dV"));
    dkv = grad_in;
  }
  return {dq.reshape({B, H, Tl, D}), dkv.select(0, 0), dkv.select(0, 1)};
}

// The group travels through the autograd context as a capsule (a counted reference): a backward
// run after the caller dropped its pointer still has the group.
struct RingAttentionFunction : torch::autograd::Function<RingAttentionFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q,
                               const torch::Tensor& k, const torch::Tensor& v,
                               const ProcessGroupPtr& group, bool causal, double scale) {
    const Ring ring{group, group->getSize(), group->getRank()};
    auto [out, lse] = ring_forward(q, k, v, ring, causal, scale);
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
    const Ring ring{group, group->getSize(), group->getRank()};
    const Grads g =
        ring_backward(q, k, v, saved[3], saved[4], grads[0], ring,
                      ctx->saved_data["causal"].toBool(), ctx->saved_data["scale"].toDouble());
    return {g.dq.to(q.scalar_type()), g.dk.to(k.scalar_type()), g.dv.to(v.scalar_type()),
            torch::Tensor(),          torch::Tensor(),          torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const ProcessGroupPtr& cp_group, bool causal,
                             std::optional<double> scale) {
  if (!cp_group) {
    throw Error(
        "ring_attention: the cp group is null; pass the process group of the ranks that "
        "share the sequence");
  }
  check_inputs(q, k, v, cp_group->getSize());
  const double s = scale.value_or(1.0 / std::sqrt(static_cast<double>(q.size(3))));
  return RingAttentionFunction::apply(q, k, v, cp_group, causal, s);
}

}  // namespace fabric::nn
