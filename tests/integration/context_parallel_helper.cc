// Test helper for context_parallel_test, and a benchmark: a self-launched job of CP processes, one
// cp group over Gloo on CPU (loopback), float32, one thread per rank.
//   context_parallel_helper CP check
// For every case (both kernels, RingAttentionKernel::kAuto (the CPU flash-attention kernel) and
// kMatmul; H = 4 query heads with Hk = 2 (grouped-query) or 4 key/value heads; causal or not;
// B = 1, T = 1024, D = 32) every rank computes, from the same seeds, the whole-sequence
// at::scaled_dot_product_attention and its gradients with respect to q, k and v for a fixed random
// upstream gradient, takes the rows of its tokens (cp_rank_positions), and runs
// fabric::nn::ring_attention on those rows with the same upstream rows. Prints, per rank and case,
//   "rank R of CP: kernel=auto H=4 Hk=2 causal=1: out_diff=X dq_diff=Y dk_diff=Z dv_diff=W"
// (max abs differences), then, per rank,
//   "rank R of CP: bf16: dtype=BFloat16 out_diff=X"  (bfloat16 inputs: the result's dtype, its
//                                                     difference from the float32 reference)
//   "rank R of CP: bad_T_error=MESSAGE"               (7 local tokens: the fabric::Error's message)
//   "rank R of CP: gpt: loss_rel=X param_diff=Y"      (the GPT under context parallelism vs whole:
//                                                     check_gpt below)
//   "rank R of CP: llama: loss_rel=X param_diff=Y"    (the Llama, Qwen2-style variant and refusals
//   "rank R of CP: qwen2: loss_rel=X param_diff=Y"     under context parallelism: check_llama)
//   "rank R of CP: llama_window_error=MESSAGE"
//   "rank R of CP: llama_bad_T_error=MESSAGE"
//   context_parallel_helper CP bench [T]
// Causal attention forward + backward at sequence T (default 4096; B = 1, H = Hk = 8, D = 64):
// rank 0 alone times at::scaled_dot_product_attention on the whole sequence (with 1 thread, then
// with CP threads, the job's share of the CPU), while the others wait in a barrier; then every
// rank times ring_attention on its T / CP tokens, with each kernel. Medians of 5 runs after 1
// warm-up (wall-clock, and the process's CPU time), printed as
//   "bench T=4096 sdpa 1 thread: forward_ms=A fwd_bwd_ms=B fwd_bwd_cpu_ms=C; 2 threads: ..."
//   "rank R of CP: bench T=4096 ring kernel=auto: forward_ms=A fwd_bwd_ms=B fwd_bwd_cpu_ms=C"
// Exits 0 (1 when a send/recv, a collective or an unexpected error failed; 2 on bad arguments).
#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/optim/sgd.h>
#include <torch/ordered_dict.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"
#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"
#include "fabric/nn/ring_attention.h"
#include "fabric/nn/ring_attention_dist.h"

namespace {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

torch::Tensor rows_of(const torch::Tensor& t, const torch::Tensor& positions) {
  return t.index_select(2, positions).contiguous();
}

struct Inputs {
  torch::Tensor q, k, v, grad;  // whole sequence
};

Inputs make_inputs(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t D, uint64_t seed) {
  torch::manual_seed(seed);
  Inputs in;
  in.q = torch::randn({B, H, T, D});
  in.k = torch::randn({B, Hk, T, D});
  in.v = torch::randn({B, Hk, T, D});
  in.grad = torch::randn({B, H, T, D});
  return in;
}

void check_case(const ProcessGroupPtr& group, fabric::nn::RingAttentionKernel kernel, int64_t H,
                int64_t Hk, bool causal) {
  const int64_t B = 1, T = 1024, D = 32, cp = group->getSize(), rank = group->getRank();
  const Inputs in = make_inputs(B, H, Hk, T, D, 1000 + H * 10 + Hk + (causal ? 1 : 0));

  // The reference on the whole sequence.
  const torch::Tensor q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_(),
                      v = in.v.clone().requires_grad_();
  const torch::Tensor ref = at::scaled_dot_product_attention(q, k, v, {}, 0.0, causal, std::nullopt,
                                                             /*enable_gqa=*/Hk != H);
  (ref * in.grad).sum().backward();

  // This rank's rows through the ring.
  const std::vector<int64_t> pos = fabric::nn::cp_rank_positions(T, cp, rank);
  const torch::Tensor positions = torch::tensor(pos, torch::kLong);
  const torch::Tensor ql = rows_of(in.q, positions).requires_grad_(),
                      kl = rows_of(in.k, positions).requires_grad_(),
                      vl = rows_of(in.v, positions).requires_grad_();
  const torch::Tensor out =
      fabric::nn::ring_attention(ql, kl, vl, group, causal, std::nullopt, kernel);
  (out * rows_of(in.grad, positions)).sum().backward();

  std::printf(
      "rank %lld of %lld: kernel=%s H=%lld Hk=%lld causal=%d: out_diff=%.3g dq_diff=%.3g "
      "dk_diff=%.3g "
      "dv_diff=%.3g\n",
      static_cast<long long>(rank), static_cast<long long>(cp),
      kernel == fabric::nn::RingAttentionKernel::kAuto ? "auto" : "matmul",
      static_cast<long long>(H), static_cast<long long>(Hk), causal ? 1 : 0,
      max_diff(out, rows_of(ref.detach(), positions)),
      max_diff(ql.grad(), rows_of(q.grad(), positions)),
      max_diff(kl.grad(), rows_of(k.grad(), positions)),
      max_diff(vl.grad(), rows_of(v.grad(), positions)));
  std::fflush(stdout);
}

// bfloat16 inputs: the result comes back in bfloat16 (computed in float32 inside).
void check_bf16(const ProcessGroupPtr& group) {
  const int64_t T = 256, cp = group->getSize(), rank = group->getRank();
  const Inputs in = make_inputs(1, 4, 2, T, 32, 77);
  const torch::Tensor q = in.q.to(torch::kBFloat16), k = in.k.to(torch::kBFloat16),
                      v = in.v.to(torch::kBFloat16);
  const torch::Tensor ref = at::scaled_dot_product_attention(
      q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat), {}, 0.0, true, std::nullopt,
      /*enable_gqa=*/true);
  const torch::Tensor positions = torch::tensor(fabric::nn::cp_rank_positions(T, cp, rank));
  torch::NoGradGuard no_grad;
  const torch::Tensor out = fabric::nn::ring_attention(rows_of(q, positions), rows_of(k, positions),
                                                       rows_of(v, positions), group, true);
  std::printf("rank %lld of %lld: bf16: dtype=%s out_diff=%.3g\n", static_cast<long long>(rank),
              static_cast<long long>(cp), c10::toString(out.scalar_type()),
              max_diff(out, rows_of(ref, positions)));
  std::fflush(stdout);
}

// 7 local tokens: T = 7 · cp is no multiple of 2 · cp. Every rank throws before communicating.
void check_bad_length(const ProcessGroupPtr& group) {
  std::string message = "(no error)";
  try {
    const torch::Tensor q = torch::randn({1, 2, 7, 8}), kv = torch::randn({1, 2, 7, 8});
    fabric::nn::ring_attention(q, kv, kv, group, true);
  } catch (const fabric::Error& e) {
    message = e.what();
  }
  std::printf("rank %d of %d: bad_T_error=%s\n", group->getRank(), group->getSize(),
              message.c_str());
  std::fflush(stdout);
}

// The largest relative loss difference over the steps and the largest parameter difference after
// them, between a model trained whole on this process and one under context parallelism.
struct Agreement {
  double loss_rel = 0, param_diff = 0;
};

// `whole` and `split` (the same initial weights; split under set_context_parallel(group)) trained
// side by side for `steps` SGD steps (lr 0.1) on random sequences of T tokens (B = 2, vocabulary
// `vocab`): whole on the whole sequences, split on this rank's tokens (cp_rank_positions), its
// loss and gradients averaged over the group, as a data-parallel wrapper over cp would.
template <typename Model>
Agreement train_side_by_side(const ProcessGroupPtr& group, Model& whole, Model& split, int64_t T,
                             int64_t vocab, int64_t steps) {
  torch::optim::SGD whole_opt(whole->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD split_opt(split->parameters(), torch::optim::SGDOptions(0.1));
  const int64_t cp = group->getSize();
  const auto mine = torch::tensor(fabric::nn::cp_rank_positions(T, cp, group->getRank()));
  Agreement a;
  for (int64_t step = 0; step < steps; ++step) {
    torch::manual_seed(700 + step);
    const torch::Tensor b = torch::randint(0, vocab, {2, T + 1});
    const torch::Tensor x = b.narrow(1, 0, T), y = b.narrow(1, 1, T);
    whole_opt.zero_grad();
    const torch::Tensor loss = whole->loss(x, y);
    loss.backward();
    whole_opt.step();
    split_opt.zero_grad();
    const torch::Tensor local = split->loss(x.index_select(1, mine), y.index_select(1, mine));
    local.backward();
    std::vector<torch::Tensor> l = {local.detach().clone()};
    fabric::distributed::wait(group->allreduce(l), "cp loss all_reduce");
    for (const torch::Tensor& p : split->parameters()) {
      std::vector<torch::Tensor> g = {p.grad()};
      fabric::distributed::wait(group->allreduce(g), "cp gradient all_reduce");
      p.mutable_grad().div_(static_cast<double>(cp));
    }
    split_opt.step();
    const double mean = l[0].item<double>() / static_cast<double>(cp), ref = loss.item<double>();
    a.loss_rel = std::max(a.loss_rel, std::abs(mean - ref) / std::abs(ref));
  }
  const torch::OrderedDict<std::string, torch::Tensor> ref = whole->named_parameters();
  for (const auto& p : split->named_parameters()) {
    const torch::Tensor diff = (p.value() - ref[p.key()]).abs().max();
    a.param_diff = std::max(a.param_diff, diff.item<double>());
  }
  return a;
}

// The tiny GPT (2 blocks, 64 wide, 4 heads, vocabulary 256, no dropout) on sequences of T = 1024
// (B = 2): once whole on this process, once under GPTImpl::set_context_parallel on this rank's
// tokens (cp_rank_positions), the loss and the gradients averaged over the group; 3 SGD steps
// (lr 0.1) each. Prints "rank R of CP: gpt: loss_rel=X param_diff=Y" (the largest relative loss
// difference over the steps, the largest parameter difference after them) and the error a model
// with dropout 0.1 gets (dropout_error=MESSAGE).
void check_gpt(const ProcessGroupPtr& group) {
  constexpr int64_t T = 1024;
  fabric::models::GPTConfig c = fabric::models::GPTConfig::preset("tiny");
  c.n_layer = 2;
  c.n_embd = 64;
  c.block_size = T;
  auto make = [&] {
    torch::manual_seed(21);
    return fabric::models::GPT(c);
  };
  auto whole = make(), split = make();
  split->set_context_parallel(group);
  const Agreement a = train_side_by_side(group, whole, split, T, 256, 3);
  std::string refused = "(accepted)";  // dropout: refused, not silently run without it
  try {
    fabric::models::GPTConfig d = c;
    d.dropout = 0.1;
    fabric::models::GPT(d)->set_context_parallel(group);
  } catch (const fabric::Error& e) {
    refused = e.what();
  }
  std::printf("rank %d of %d: gpt: loss_rel=%.3g param_diff=%.3g dropout_error=%s\n",
              group->getRank(), group->getSize(), a.loss_rel, a.param_diff, refused.c_str());
  std::fflush(stdout);
}

// The Llama family under LlamaImpl::set_context_parallel, as check_gpt: a tiny Llama (2 layers, 64
// wide, 4 query heads over 2 key/value heads, SwiGLU 128, vocabulary 256, untied lm_head) on
// sequences of T = 1024, and a Qwen2-style one (q/k/v biases, the output layer tied to the
// embedding, 4 query heads over 1 key/value head, rope_theta 1e6) on T = 512; 3 SGD steps each.
// Prints "rank R of CP: llama: ..." and "... qwen2: loss_rel=X param_diff=Y", then the errors of a
// sequence longer than sliding_window 512 (llama_window_error=) and of 7 tokens per rank
// (llama_bad_T_error=), both thrown on every rank before any layer communicates.
void check_llama(const ProcessGroupPtr& group) {
  fabric::models::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 1024;
  fabric::models::LlamaConfig q = c;
  q.model_type = "qwen2";
  q.num_key_value_heads = 1;
  q.qkv_bias = true;
  q.tie_word_embeddings = true;
  q.rope_theta = 1e6;
  const int64_t cp = group->getSize();
  for (const auto& [name, config, T] :
       {std::tuple{"llama", c, int64_t{1024}}, std::tuple{"qwen2", q, int64_t{512}}}) {
    auto make = [&, &config = config] {
      torch::manual_seed(22);
      fabric::models::Llama model(config);
      // q and k sharpened (x 8) so that the attention, and with it the rotary positions, matter:
      // at N(0, 0.02) the scores are near 0, the attention near uniform, and rotary angles at the
      // local positions 0 .. T/cp − 1 instead of the global ones moved the parameters by only
      // 7.6e-6 in 3 steps (cp 2).
      torch::NoGradGuard no_grad;
      for (auto& layer : model->layers) {
        layer->self_attn->q_proj->weight.mul_(8);
        layer->self_attn->k_proj->weight.mul_(8);
      }
      return model;
    };
    auto whole = make(), split = make();
    split->set_context_parallel(group);
    const Agreement a = train_side_by_side(group, whole, split, T, 256, 3);
    std::printf("rank %d of %d: %s: loss_rel=%.3g param_diff=%.3g\n", group->getRank(),
                group->getSize(), name, a.loss_rel, a.param_diff);
    std::fflush(stdout);
  }
  auto refused = [&](const fabric::models::LlamaConfig& config, int64_t local) {
    std::string message = "(accepted)";
    try {
      fabric::models::Llama model(config);
      model->set_context_parallel(group);
      model->loss(torch::zeros({1, local}, torch::kLong), torch::zeros({1, local}, torch::kLong));
    } catch (const fabric::Error& e) {
      message = e.what();
    }
    return message;
  };
  fabric::models::LlamaConfig windowed = c;
  windowed.sliding_window = 512;
  std::printf("rank %d of %d: llama_window_error=%s\n", group->getRank(), group->getSize(),
              refused(windowed, 1024 / cp).c_str());
  std::printf("rank %d of %d: llama_bad_T_error=%s\n", group->getRank(), group->getSize(),
              refused(c, 7).c_str());
  std::fflush(stdout);
}

// Medians over 5 runs after 1 warm-up: wall-clock and this process's CPU time (all its threads,
// Gloo's included), in milliseconds. CPU time below wall time: the process waited (for a peer, or
// for a core other programs held).
struct Timing {
  double wall_ms, cpu_ms;
};

double cpu_now_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

Timing median_ms(const std::function<void()>& f) {
  f();  // warm-up
  std::vector<double> wall, cpu;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_now_ms();
    f();
    cpu.push_back(cpu_now_ms() - c0);
    wall.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  return {wall[2], cpu[2]};
}

void bench(const ProcessGroupPtr& group, int64_t T) {
  const int64_t B = 1, H = 8, D = 64, cp = group->getSize(), rank = group->getRank();
  const Inputs in = make_inputs(B, H, H, T, D, 5);
  if (rank == 0) {
    auto sdpa = [&] {
      const torch::Tensor q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_(),
                          v = in.v.clone().requires_grad_();
      (at::scaled_dot_product_attention(q, k, v, {}, 0.0, true) * in.grad).sum().backward();
    };
    const Timing forward = median_ms([&] {
      torch::NoGradGuard no_grad;
      at::scaled_dot_product_attention(in.q, in.k, in.v, {}, 0.0, true);
    });
    const Timing one = median_ms(sdpa);
    torch::set_num_threads(static_cast<int>(cp));
    const Timing all = median_ms(sdpa);
    torch::set_num_threads(1);
    std::printf(
        "bench T=%lld sdpa 1 thread: forward_ms=%.1f fwd_bwd_ms=%.1f fwd_bwd_cpu_ms=%.1f; "
        "%lld threads: fwd_bwd_ms=%.1f\n",
        static_cast<long long>(T), forward.wall_ms, one.wall_ms, one.cpu_ms,
        static_cast<long long>(cp), all.wall_ms);
    std::fflush(stdout);
  }
  group->barrier()->wait();
  const torch::Tensor positions = torch::tensor(fabric::nn::cp_rank_positions(T, cp, rank));
  const torch::Tensor ql = rows_of(in.q, positions), kl = rows_of(in.k, positions),
                      vl = rows_of(in.v, positions), gl = rows_of(in.grad, positions);
  for (const auto kernel :
       {fabric::nn::RingAttentionKernel::kAuto, fabric::nn::RingAttentionKernel::kMatmul}) {
    const Timing forward = median_ms([&] {
      torch::NoGradGuard no_grad;
      fabric::nn::ring_attention(ql, kl, vl, group, true, std::nullopt, kernel);
    });
    const Timing ring = median_ms([&] {
      const torch::Tensor q = ql.clone().requires_grad_(), k = kl.clone().requires_grad_(),
                          v = vl.clone().requires_grad_();
      (fabric::nn::ring_attention(q, k, v, group, true, std::nullopt, kernel) * gl)
          .sum()
          .backward();
    });
    std::printf(
        "rank %lld of %lld: bench T=%lld ring kernel=%s: forward_ms=%.1f fwd_bwd_ms=%.1f "
        "fwd_bwd_cpu_ms=%.1f\n",
        static_cast<long long>(rank), static_cast<long long>(cp), static_cast<long long>(T),
        kernel == fabric::nn::RingAttentionKernel::kAuto ? "auto" : "matmul", forward.wall_ms,
        ring.wall_ms, ring.cpu_ms);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const int64_t world = std::atoll(argv[1]);
  const std::string mode = argv[2];
  if (world < 1 || (mode != "check" && mode != "bench")) return 2;
  const int64_t T = argc > 3 ? std::atoll(argv[3]) : 4096;
  auto env = fabric::detect_environment(fabric::process_environment(), world);
  const int64_t rank = env->global_rank();
  const std::chrono::seconds timeout(120);
  fabric::distributed::StoreOptions store_options;
  store_options.world_size = world;
  store_options.timeout = timeout;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  c10::intrusive_ptr<c10d::Store> store;
  if (rank == 0) {
    store_options.is_server = true;
    store = fabric::distributed::make_store(store_options);
    fabric::LaunchOptions launch;
    launch.world_size = world;
    launch.master_port = fabric::distributed::store_port(store);
    launcher = std::make_unique<fabric::SubprocessLauncher>(
        launch, std::vector<std::string>(argv, argv + argc));
  } else {
    store_options.port = env->main_port();
    store = fabric::distributed::make_store(store_options);
  }
  torch::set_num_threads(1);
  fabric::distributed::ProcessGroupOptions options;
  options.rank = rank;
  options.world_size = world;
  options.timeout = timeout;
  options.cpu_backend = fabric::distributed::CpuBackend::kGloo;
  const ProcessGroupPtr group = fabric::distributed::make_process_group(store, options);
  try {
    if (mode == "check") {
      for (const auto kernel :
           {fabric::nn::RingAttentionKernel::kAuto, fabric::nn::RingAttentionKernel::kMatmul}) {
        for (const int64_t hk : {2, 4}) {
          for (const bool causal : {true, false}) check_case(group, kernel, 4, hk, causal);
        }
      }
      check_bf16(group);
      check_bad_length(group);
      check_gpt(group);
      check_llama(group);
    } else {
      bench(group, T);
    }
  } catch (const std::exception& e) {
    std::printf("rank %lld of %lld: failed: %s\n", static_cast<long long>(rank),
                static_cast<long long>(world), e.what());
    std::fflush(stdout);
    return 1;
  }
  group->barrier()->wait();
  return launcher ? launcher->wait() : 0;
}
