// Test helper for tensor_parallel_test: a self-launched job of WORLD processes on the mesh
// {dp: WORLD / TP, tp: TP}. Every rank trains the tiny GPT (fp32, no dropout, 3 layers, 64 wide,
// sequences of 32) for STEPS SGD-momentum steps twice:
//   the reference: alone, on the whole batch of every step;
//   split: parallelize()d over its tp group with the GPT's plan, on its dp coordinate's rows of
//     the batch, gradients averaged over the dp group after backward.
// Then it compares: the loss of every step (the split one averaged over dp), the whole logits of
// the trained models on one batch (tied_logits gathers the vocabulary), and every parameter (the
// split ones gathered from their slices). Prints, per rank,
//   "rank R of W: max_loss_diff=X max_param_diff=Y max_logit_diff=Z split_bytes=S whole_bytes=B"
// and exits 0 (1 when a collective or a check failed).
//   tensor_parallel_helper WORLD TP STEPS [sp]
// sp: with sequence parallelism (TensorParallelPlan::sequence_parallel).
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "fabric/distributed/device_mesh.h"
#include "fabric/distributed/process_group.h"
#include "fabric/environments/environments.h"
#include "fabric/launchers/subprocess_launcher.h"
#include "fabric/models/gpt.h"

namespace {

constexpr int64_t kBatch = 4, kSeq = 32;

fabric::models::GPT make_model() {
  fabric::models::GPTConfig c = fabric::models::GPTConfig::preset("tiny");
  c.n_layer = 3;
  c.n_embd = 64;
  c.block_size = kSeq;
  torch::manual_seed(11);
  return fabric::models::GPT(c);
}

torch::Tensor batch(int64_t step) {
  torch::manual_seed(500 + step);
  return torch::randint(0, 256, {kBatch, kSeq + 1}, torch::kLong);
}

// SGD with momentum: Adam's update m / (sqrt(v) + eps) turns a rounding difference in a gradient
// near zero into a step of up to 2 · lr, so a parity bound on parameters would measure that.
torch::optim::SGD make_optimizer(fabric::models::GPT& model) {
  return torch::optim::SGD(model->parameters(),
                           torch::optim::SGDOptions(0.3).momentum(0.9).weight_decay(0.01));
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) return 2;
  const bool sp = argc == 5 && std::string(argv[4]) == "sp";
  const int64_t world = std::atoll(argv[1]), tp = std::atoll(argv[2]), steps = std::atoll(argv[3]);
  auto env = fabric::detect_environment(fabric::process_environment(), world);
  const int64_t rank = env->global_rank();
  const std::chrono::seconds timeout(60);
  c10::intrusive_ptr<c10d::Store> store;
  std::unique_ptr<fabric::SubprocessLauncher> launcher;
  if (rank == 0) {
    store = fabric::distributed::make_store({"127.0.0.1", 0, true, world, timeout});
    launcher = std::make_unique<fabric::SubprocessLauncher>(
        fabric::LaunchOptions{world, fabric::distributed::store_port(store)},
        std::vector<std::string>(argv, argv + argc));
  } else {
    store = fabric::distributed::make_store({"127.0.0.1", env->main_port(), false, world, timeout});
  }
  torch::set_num_threads(1);
  fabric::distributed::DeviceMesh mesh(store, {rank, world, timeout},
                                       {{"dp", world / tp}, {"tp", tp}});
  const int64_t dp = mesh.size("dp"), dp_rank = mesh.coordinate("dp");

  // The reference, on the whole batch.
  auto reference = make_model();
  auto ref_opt = make_optimizer(reference);
  std::vector<double> ref_losses;
  for (int64_t s = 0; s < steps; ++s) {
    const torch::Tensor b = batch(s);
    ref_opt.zero_grad();
    torch::Tensor loss = reference->loss(b.narrow(1, 0, kSeq), b.narrow(1, 1, kSeq));
    loss.backward();
    ref_opt.step();
    ref_losses.push_back(loss.item<double>());
  }

  // Split.
  auto model = make_model();
  int64_t whole_bytes = 0, split_bytes = 0;
  auto split_modules = [&] {
    int64_t n = 0;
    for (const auto& m : model->named_modules("", false)) {
      if (auto* l = m.value()->as<fabric::nn::LinearImpl>())
        n += l->weight.nbytes() + (l->bias.defined() ? l->bias.nbytes() : 0);
      if (auto* e = m.value()->as<fabric::nn::EmbeddingImpl>()) n += e->weight.nbytes();
    }
    return n;
  };
  whole_bytes = split_modules();
  fabric::nn::TensorParallelPlan plan = model->tensor_parallel_plan();
  plan.sequence_parallel = sp;
  fabric::nn::parallelize(*model, plan, mesh.group("tp"));
  split_bytes = split_modules();
  auto opt = make_optimizer(model);
  const auto dp_group = mesh.group("dp");
  double max_loss_diff = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const torch::Tensor rows = batch(s).chunk(dp, 0)[dp_rank];
    opt.zero_grad();
    torch::Tensor loss = model->loss(rows.narrow(1, 0, kSeq), rows.narrow(1, 1, kSeq));
    loss.backward();
    for (const torch::Tensor& p : model->parameters()) {
      std::vector<torch::Tensor> g = {p.grad()};
      fabric::distributed::wait(dp_group->allreduce(g), "dp gradient all_reduce");
      p.mutable_grad().div_(static_cast<double>(dp));
    }
    opt.step();
    std::vector<torch::Tensor> l = {loss.detach().clone()};
    fabric::distributed::wait(dp_group->allreduce(l), "dp loss all_reduce");
    max_loss_diff = std::max(max_loss_diff, std::abs(l[0].item<double>() / dp - ref_losses[s]));
  }

  double max_param_diff = 0;
  auto whole_of = [&](torch::nn::Module& m, const std::string& leaf, const torch::Tensor& t) {
    if (auto* l = m.as<fabric::nn::LinearImpl>(); l != nullptr && l->parallel()) {
      const auto& p = *l->parallel();
      if (leaf == "bias" && p.dim == 1) return t;  // a row layer's bias is whole on every rank
      return p.gather(t, leaf == "bias" ? 0 : p.dim);
    }
    if (auto* e = m.as<fabric::nn::EmbeddingImpl>(); e != nullptr && e->parallel())
      return e->parallel()->gather(t, 0);
    return t;
  };
  const auto ref_params = reference->named_parameters();
  for (const auto& m : model->named_modules()) {
    for (const auto& p : m.value()->named_parameters(/*recurse=*/false)) {
      const std::string name = (m.key().empty() ? "" : m.key() + ".") + p.key();
      const torch::Tensor whole = whole_of(*m.value(), p.key(), p.value().detach());
      max_param_diff = std::max(max_param_diff, max_abs_diff(whole, ref_params[name]));
    }
  }
  torch::NoGradGuard no_grad;
  const torch::Tensor probe = batch(1000).narrow(1, 0, kSeq);
  double max_logit_diff = max_abs_diff(model->forward(probe), reference->forward(probe));
  // A length tp does not divide (a sample's prompt): sequence parallelism pads it.
  const torch::Tensor odd = probe.narrow(1, 0, kSeq - 3);
  max_logit_diff =
      std::max(max_logit_diff, max_abs_diff(model->forward(odd), reference->forward(odd)));
  std::printf(
      "rank %lld of %lld: max_loss_diff=%.3g max_param_diff=%.3g max_logit_diff=%.3g "
      "split_bytes=%lld whole_bytes=%lld\n",
      static_cast<long long>(rank), static_cast<long long>(world), max_loss_diff, max_param_diff,
      max_logit_diff, static_cast<long long>(split_bytes), static_cast<long long>(whole_bytes));
  std::fflush(stdout);
  mesh.group("tp")->barrier()->wait();
  return launcher ? launcher->wait() : 0;
}
