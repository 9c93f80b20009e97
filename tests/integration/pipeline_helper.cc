// Test helper for pipeline_test: a self-launched job of WORLD processes on the mesh {pp: PP, dp:
// WORLD / (PP x TP), tp: TP} (pp outermost, tp innermost). Every rank trains a tiny MODEL (fp32, no
// dropout, LAYERS blocks, 64 wide, sequences of 32, batches of 8) for STEPS SGD-momentum steps
// three ways:
//   whole:        alone, on the whole batch of every step (what ddp equals);
//   accumulated:  alone, on the same micro-batches, each loss / m backward in order (the sums of
//                 the pipeline's gradients in the same order);
//   pipeline:     its stages of the model cut into PP x V stages (GPTStages or LlamaStages), run by
//                 PipelineRunner with SCHEDULE over M micro-batches of its dp coordinate's rows;
//                 a tied embedding's gradient summed between the first and the last stage's ranks,
//                 every gradient averaged over dp; with TP > 1 the model is split over its tp
//                 group (the GPT's plan, fabric::nn::parallelize) before it is cut.
// Then it compares the pipeline's losses and final parameters, and its evaluation
// (PipelineRunner::evaluate, forwards only) of a new batch (eval_rel, relative), (by the whole
// model's names) with the whole run's, and its parameters after the first step with the accumulated
// run's (after that, a tied embedding's different summation order spreads to every parameter).
// Prints, per rank,
//   "rank R of W: max_loss_rel=X max_param_diff=Y accumulated_differ=N [names] param_bytes=B
//    whole_bytes=C peak_in_flight=P"
// (accumulated_differ: this rank's parameters not bitwise equal to the accumulated run's after
// step 1; -1 with dp or tp > 1, whose all-reduces change the order anyway; split parameters are
// gathered whole before they are compared) and
// exits 0 (1 when a collective or a check failed).
//   pipeline_helper WORLD PP SCHEDULE M V STEPS LAYERS TP MODEL [CLIP]
// CLIP > 0: gradients clipped to that total norm (PipelineRunner::clip_grad_norm over the
// stages; clip_grad_norm_ in the references), tp 1 only.
// MODEL: gpt, llama (grouped-query attention, its own lm_head), llama_tied (the output layer
// tied to the embedding, as Qwen2's small models) or sequential (a torch::nn::Sequential cut at
// a split point; LAYERS is ignored).
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

#include "fabric/distributed/device_mesh.h"
#include "fabric/distributed/pipeline_runtime.h"
#include "fabric/distributed/process_group.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"
#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"
#include "fabric/models/pipeline_stages.h"
#include "fabric/nn/tensor_parallel.h"

namespace {

constexpr int64_t kBatch = 8, kSeq = 32;

// One of the tiny models, whole: the GPT (gpt), a Llama with grouped-query attention and its own
// lm_head (llama), or one whose output layer is tied to the embedding, as Qwen2's small models
// (llama_tied). All 64 wide, vocabulary 256.
struct Whole {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
  fabric::nn::TensorParallelPlan plan;
};

Whole make_model(const std::string& kind, int64_t layers) {
  torch::manual_seed(11);
  if (kind == "gpt") {
    fabric::models::GPTConfig c = fabric::models::GPTConfig::preset("tiny");
    c.n_layer = layers;
    c.n_embd = 64;
    c.block_size = kSeq;
    fabric::models::GPT g(c);
    return {g.ptr(),
            [g](const torch::Tensor& x, const torch::Tensor& y) mutable { return g->loss(x, y); },
            g->tensor_parallel_plan()};
  }
  if (kind == "sequential") {  // a user's model: embedding, two tanh MLP layers, output layer
    torch::nn::Sequential net(torch::nn::Embedding(256, 64), torch::nn::Linear(64, 64),
                              torch::nn::Tanh(), torch::nn::Linear(64, 64), torch::nn::Tanh(),
                              torch::nn::Linear(64, 256));
    return {net.ptr(),
            [net](const torch::Tensor& x, const torch::Tensor& y) mutable {
              return torch::cross_entropy_loss(net->forward(x).flatten(0, 1), y.flatten());
            },
            {}};
  }
  fabric::models::LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = kSeq;
  c.tie_word_embeddings = kind == "llama_tied";
  fabric::models::Llama l(c);
  return {l.ptr(),
          [l](const torch::Tensor& x, const torch::Tensor& y) mutable { return l->loss(x, y); },
          l->tensor_parallel_plan()};
}

// This rank's stages of `whole`, and how they run.
struct Mine {
  std::shared_ptr<fabric::models::PipelineStagesImpl> module;
  std::function<torch::Tensor(int64_t, const torch::Tensor&)> forward;
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> loss;
};

Mine cut(const std::string& kind, const Whole& whole, const std::vector<int64_t>& stages,
         int64_t stage_count) {
  if (kind == "gpt") {
    fabric::models::GPTStages g(
        fabric::models::GPT(std::dynamic_pointer_cast<fabric::models::GPTImpl>(whole.module)),
        stages, stage_count);
    return {g.ptr(), [g](int64_t k, const torch::Tensor& in) mutable { return g->forward(k, in); },
            [g](const torch::Tensor& x, const torch::Tensor& y) mutable { return g->loss(x, y); }};
  }
  if (kind == "sequential") {  // cut after the first Linear: [embedding, Linear] | [the rest]
    fabric::models::SequentialStages q(
        torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(whole.module)),
        stages, stage_count, stage_count == 2 ? std::vector<int64_t>{2} : std::vector<int64_t>{});
    return {q.ptr(), [q](int64_t k, const torch::Tensor& in) mutable { return q->forward(k, in); },
            [](const torch::Tensor& x, const torch::Tensor& y) {
              return torch::cross_entropy_loss(x.flatten(0, 1), y.flatten());
            }};
  }
  fabric::models::LlamaStages l(
      fabric::models::Llama(std::dynamic_pointer_cast<fabric::models::LlamaImpl>(whole.module)),
      stages, stage_count);
  return {l.ptr(), [l](int64_t k, const torch::Tensor& in) mutable { return l->forward(k, in); },
          [l](const torch::Tensor& x, const torch::Tensor& y) mutable { return l->loss(x, y); }};
}

torch::Tensor batch(int64_t step) {
  torch::manual_seed(500 + step);
  return torch::randint(0, 256, {kBatch, kSeq + 1}, torch::kLong);
}

torch::optim::SGD make_optimizer(const std::vector<torch::Tensor>& params) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

int64_t bytes(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.nbytes();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10 && argc != 11) {
    std::fprintf(stderr,
                 "usage: pipeline_helper WORLD PP SCHEDULE M V STEPS LAYERS TP MODEL [CLIP]\n");
    return 2;
  }
  const int64_t world = std::atoll(argv[1]), pp = std::atoll(argv[2]);
  const auto schedule = fabric::distributed::parse_pipeline_schedule(argv[3]);
  const int64_t m = std::atoll(argv[4]), v = std::atoll(argv[5]), steps = std::atoll(argv[6]),
                layers = std::atoll(argv[7]), tp = std::atoll(argv[8]);
  const std::string kind = argv[9];
  const double clip = argc == 11 ? std::atof(argv[10]) : 0.0;
  torch::set_num_threads(1);
  int64_t rank = 0;
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  std::unique_ptr<fabric::distributed::DeviceMesh> mesh;
  if (world > 1) {
    auto env = fabric::detect_environment(fabric::process_environment(), world);
    rank = env->global_rank();
    const std::chrono::seconds timeout(60);
    if (rank == 0) {
      store = fabric::distributed::make_store({"127.0.0.1", 0, true, world, timeout});
      launcher = std::make_unique<fabric::SubprocessLauncher>(
          fabric::LaunchOptions{world, fabric::distributed::store_port(store)},
          std::vector<std::string>(argv, argv + argc));
    } else {
      store =
          fabric::distributed::make_store({"127.0.0.1", env->main_port(), false, world, timeout});
    }
    mesh = std::make_unique<fabric::distributed::DeviceMesh>(
        store, fabric::distributed::ProcessGroupOptions{rank, world, timeout},
        std::vector<fabric::distributed::MeshDim>{{"pp", pp}, {"dp", world / pp / tp}, {"tp", tp}});
  }
  const int64_t dp = mesh ? mesh->size("dp") : 1, dp_rank = mesh ? mesh->coordinate("dp") : 0;
  // The accumulated run's order of sums (clipping sums the norm over the ranks in another).
  const bool exact = dp == 1 && tp == 1 && clip == 0;

  // The references, on one process.
  const Whole whole_ref = make_model(kind, layers), accumulated_ref = make_model(kind, layers);
  auto whole_opt = make_optimizer(whole_ref.module->parameters());
  auto accumulated_opt = make_optimizer(accumulated_ref.module->parameters());
  std::vector<double> ref_losses;
  double first_norm = 0, pipeline_first_norm = 0;  // the gradients' norm at step 1 (clipping)
  for (int64_t s = 0; s < steps; ++s) {
    const torch::Tensor b = batch(s);
    whole_opt.zero_grad();
    torch::Tensor loss = whole_ref.loss(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq));
    loss.backward();
    if (clip > 0) {
      const double norm = torch::nn::utils::clip_grad_norm_(whole_ref.module->parameters(), clip);
      if (s == 0) first_norm = norm;
    }
    whole_opt.step();
    ref_losses.push_back(loss.item<double>());
    if (exact && s == 0) {
      accumulated_opt.zero_grad();
      for (const torch::Tensor& mb : b.chunk(m, 0)) {
        torch::Tensor l = accumulated_ref.loss(mb.narrow(1, 0, kSeq), mb.narrow(1, 1, kSeq));
        (l / static_cast<double>(m)).backward();
      }
      accumulated_opt.step();
    }
  }

  // The pipeline.
  fabric::distributed::PipelineOptions options;
  options.schedule = schedule;
  options.micro_batches = m;
  options.virtual_stages = v;
  options.activation_sizes = {kBatch / dp / m, kSeq, 64};
  fabric::distributed::PipelineRunner runner(
      mesh ? mesh->group("pp") : c10::intrusive_ptr<c10d::ProcessGroup>(), options);
  Whole whole = make_model(kind, layers);
  const int64_t whole_bytes = bytes(*whole.module);
  if (tp > 1) fabric::nn::parallelize(*whole.module, whole.plan, mesh->group("tp"));
  const Mine mine = cut(kind, whole, runner.local_stages(), runner.stages());
  whole = Whole();  // the other ranks' blocks go with it
  auto opt = make_optimizer(mine.module->parameters());
  const int64_t first_rank = 0, last_rank = (runner.stages() - 1) % pp;
  double max_loss_rel = 0;  // |loss - whole run's| / whole run's
  int64_t differ = 0;       // after the first step: parameters not bitwise the accumulated run's
  std::string differ_names;
  std::vector<torch::Tensor> tokens, targets;
  fabric::distributed::PipelineStageCalls calls;
  calls.forward = [&](int64_t k, int64_t mb, const torch::Tensor& in) {
    return mine.forward(k, k == 0 ? tokens[static_cast<size_t>(mb)] : in);
  };
  calls.loss = [&](int64_t mb, const torch::Tensor& out) {
    return mine.loss(out, targets[static_cast<size_t>(mb)]);
  };
  for (int64_t s = 0; s < steps; ++s) {
    const torch::Tensor rows = batch(s).chunk(dp, 0)[dp_rank];
    tokens.clear();
    targets.clear();
    for (const torch::Tensor& mb : fabric::distributed::split_micro_batches(rows, m)) {
      tokens.push_back(mb.narrow(1, 0, kSeq));
      targets.push_back(mb.narrow(1, 1, kSeq));
    }
    opt.zero_grad();
    torch::Tensor loss = runner.step(calls);
    if (const torch::Tensor tied = mine.module->tied_weight(); tied.defined()) {
      torch::Tensor g = tied.grad();
      runner.sum_between(g, first_rank, last_rank);
    }
    if (dp > 1) {
      for (const torch::Tensor& p : mine.module->parameters()) {
        std::vector<torch::Tensor> g = {p.grad()};
        fabric::distributed::wait(mesh->group("dp")->allreduce(g), "dp gradient all_reduce");
        p.mutable_grad().div_(static_cast<double>(dp));
      }
      std::vector<torch::Tensor> l = {loss};
      fabric::distributed::wait(mesh->group("dp")->allreduce(l), "dp loss all_reduce");
      loss = l[0] / static_cast<double>(dp);
    }
    if (clip > 0) {
      std::vector<torch::Tensor> shared;
      if (const torch::Tensor tied = mine.module->tied_weight(); tied.defined())
        shared.push_back(tied);
      const double norm =
          runner.clip_grad_norm(mine.module->parameters(), clip, shared).item<double>();
      if (s == 0) pipeline_first_norm = norm;
    }
    opt.step();
    max_loss_rel = std::max(
        max_loss_rel, std::abs(loss.item<double>() - ref_losses[s]) / std::abs(ref_losses[s]));
    if (exact && s == 0) {
      const auto accumulated_params = accumulated_ref.module->named_parameters();
      for (const auto& p : mine.module->named_parameters()) {
        if (!torch::equal(p.value(), accumulated_params[p.key()])) {
          ++differ;
          differ_names += (differ_names.empty() ? "" : ",") + p.key();
        }
      }
    }
  }

  // Evaluation (forwards only) on a batch no step saw.
  const torch::Tensor probe = batch(1000);
  double eval_rel = 0;
  {
    const torch::Tensor rows = probe.chunk(dp, 0)[dp_rank];
    tokens.clear();
    targets.clear();
    for (const torch::Tensor& mb : fabric::distributed::split_micro_batches(rows, m)) {
      tokens.push_back(mb.narrow(1, 0, kSeq));
      targets.push_back(mb.narrow(1, 1, kSeq));
    }
    std::vector<torch::Tensor> grads_before;
    for (const auto& p : mine.module->parameters()) grads_before.push_back(p.grad().clone());
    torch::Tensor loss = runner.evaluate(calls);
    if (dp > 1) {
      std::vector<torch::Tensor> l = {loss};
      fabric::distributed::wait(mesh->group("dp")->allreduce(l), "dp loss all_reduce");
      loss = l[0] / static_cast<double>(dp);
    }
    torch::NoGradGuard no_grad;
    const double ref =
        whole_ref.loss(probe.narrow(1, 0, kSeq), probe.narrow(1, 1, kSeq)).item<double>();
    eval_rel = std::abs(loss.item<double>() - ref) / std::abs(ref);
    size_t i = 0;  // evaluate computes no gradient: the last step's stay as they were
    for (const auto& p : mine.module->parameters())
      if (!torch::equal(p.grad(), grads_before[i++])) eval_rel = 1;
  }

  double max_param_diff = 0;
  const auto whole_params = whole_ref.module->named_parameters();
  const int64_t param_bytes = bytes(*mine.module);
  if (tp > 1) fabric::nn::unparallelize(*mine.module);  // the split tensors whole again
  for (const auto& p : mine.module->named_parameters())
    max_param_diff = std::max(max_param_diff, max_abs_diff(p.value(), whole_params[p.key()]));
  std::printf(
      "rank %lld of %lld: max_loss_rel=%.3g max_param_diff=%.3g accumulated_differ=%lld [%s] "
      "param_bytes=%lld whole_bytes=%lld peak_in_flight=%lld first_norm=%.9g "
      "pipeline_first_norm=%.9g eval_rel=%.3g\n",
      static_cast<long long>(rank), static_cast<long long>(world), max_loss_rel, max_param_diff,
      static_cast<long long>(exact ? differ : -1), differ_names.c_str(),
      static_cast<long long>(param_bytes), static_cast<long long>(whole_bytes),
      static_cast<long long>(runner.peak_in_flight()), first_norm, pipeline_first_norm, eval_rel);
  std::fflush(stdout);
  if (mesh) mesh->group("pp")->barrier()->wait();
  return launcher ? launcher->wait() : 0;
}
