// Test helper for accumulation_test: a Fabric program (ranks self-launched) that trains an MLP for
// test.steps SGD-momentum steps, each over test.k micro-batches of test.batch examples per rank,
// then on rank 0 compares the parameters with one process taking the same steps with plain
// LibTorch on the whole global batch (k · batch · world examples, mean loss).
// Extra keys:
//   test.k      4        micro-batches per optimizer step
//   test.batch  5        examples per micro-batch
//   test.steps  6        optimizer steps
//   test.mode   backward backward: Fabric::backward(loss, MicroBatch) + Fabric::step;
//                        graphed: fabric::GraphedStep's micro-batch call (the examples' path);
//                        short: odd steps have k - 1 micro-batches (an epoch's shorter last group);
//                        bad_index: one backward with micro-batch k of k (must be refused)
// Prints (rank 0) "max_rel_diff=X synced_backward_passes=N optimizer_steps=S" and exits 0 when X is
// within 1e-6 and, under ddp/fsdp, every rank synchronized gradients once per optimizer step
// (not once per micro-batch); with bad_index it prints "error: ..." and exits 1.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>

#include "fabric/fabric.h"
#include "fabric/graphed_step.h"
#include "fabric/main.h"
#include "strategies/ddp.h"
#include "strategies/fsdp.h"

namespace {

torch::nn::Sequential make_model() {
  torch::manual_seed(1234);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                               torch::nn::Linear(16, 4));
}

// The global batch of step `step` with `count` micro-batches per rank.
std::pair<torch::Tensor, torch::Tensor> global_batch(int64_t step, int64_t count, int64_t batch,
                                                     int64_t world) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(100 + step));
  const int64_t n = world * count * batch;
  return {torch::randn({n, 8}, gen), torch::randn({n, 4}, gen)};
}

int64_t micro_count(const std::string& mode, int64_t step, int64_t k) {
  return mode == "short" && step % 2 == 1 ? k - 1 : k;
}

int64_t synced_passes(fabric::Strategy& strategy) {
  if (auto* ddp = dynamic_cast<fabric::strategies::Ddp*>(&strategy))
    return ddp->synced_backward_passes();
  if (auto* fsdp = dynamic_cast<fabric::strategies::Fsdp*>(&strategy))
    return fsdp->synced_backward_passes();
  return -1;  // nothing to synchronize
}

}  // namespace

int main(int argc, char** argv) {
  fabric::ConfigSchema schema = fabric::training_schema();
  schema.add("test.k", fabric::KeySpec::integer(4).min(2));
  schema.add("test.batch", fabric::KeySpec::integer(5).min(1));
  schema.add("test.steps", fabric::KeySpec::integer(6).min(1));
  schema.add("test.mode",
             fabric::KeySpec::choice({"backward", "graphed", "short", "bad_index"}, "backward"));
  return fabric::run_main(argc, argv, schema, [](const fabric::Config& c) {
    fabric::Fabric fabric(c);
    return fabric.launch([&](fabric::Fabric& f) -> int {
      const int64_t k = c.get_int("test.k"), batch = c.get_int("test.batch");
      const int64_t steps = c.get_int("test.steps");
      const std::string mode = c.get_string("test.mode");
      const int64_t world = f.world_size(), rank = f.global_rank();
      auto model = make_model();
      torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
      f.setup(model, optimizer);
      auto loss_of = [&](const std::vector<torch::Tensor>& b) {
        return torch::mse_loss(model->forward(b[0]), b[1]);
      };
      fabric::GraphedStep graphed(f, optimizer, loss_of);
      if (mode == "bad_index") {
        auto [x, y] = global_batch(0, k, batch, world);
        f.backward(loss_of({x, y}), fabric::MicroBatch{k, k});  // throws
        return 0;
      }
      for (int64_t s = 0; s < steps; ++s) {
        const int64_t count = micro_count(mode, s, k);
        auto [x, y] = global_batch(s, count, batch, world);
        for (int64_t i = 0; i < count; ++i) {
          const int64_t row = (rank * count + i) * batch;
          std::vector<torch::Tensor> b = {x.narrow(0, row, batch), y.narrow(0, row, batch)};
          const fabric::MicroBatch micro{i, count};
          if (mode == "graphed") {
            graphed(b, micro);
          } else {
            if (micro.first()) optimizer.zero_grad();
            f.backward(loss_of(b), micro);
            if (micro.last()) f.step(optimizer);
          }
        }
      }
      const int64_t synced = synced_passes(f.strategy());
      const double worst_synced =
          f.all_reduce(static_cast<double>(synced == -1 ? steps : synced), fabric::ReduceOp::kMax);
      const double least_synced =
          f.all_reduce(static_cast<double>(synced == -1 ? steps : synced), fabric::ReduceOp::kMin);
      std::vector<torch::Tensor> trained;
      {
        auto whole = f.strategy().materialize_parameters(*model, /*write_back=*/false);
        for (const auto& p : model->parameters()) trained.push_back(p.detach().clone());
      }
      if (rank != 0) return 0;

      // The reference: one process, the whole global batch per step, plain LibTorch.
      auto reference = make_model();
      torch::optim::SGD ref_opt(reference->parameters(),
                                torch::optim::SGDOptions(0.1).momentum(0.9));
      for (int64_t s = 0; s < steps; ++s) {
        auto [x, y] = global_batch(s, micro_count(mode, s, k), batch, world);
        ref_opt.zero_grad();
        torch::mse_loss(reference->forward(x), y).backward();
        ref_opt.step();
      }
      double max_rel = 0;
      const auto ref = reference->parameters();
      for (size_t i = 0; i < ref.size(); ++i) {
        const double rel =
            ((trained[i].cpu() - ref[i]).abs().max() / ref[i].abs().max().clamp_min(1e-12))
                .item<double>();
        max_rel = std::max(max_rel, rel);
      }
      std::printf("max_rel_diff=%.3g synced_backward_passes=%lld..%lld optimizer_steps=%lld\n",
                  max_rel, static_cast<long long>(least_synced),
                  static_cast<long long>(worst_synced), static_cast<long long>(steps));
      std::fflush(stdout);
      const bool once_per_step = least_synced == steps && worst_synced == steps;
      return max_rel <= 1e-6 && once_per_step ? 0 : 1;
    });
  });
}
