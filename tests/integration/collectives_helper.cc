// Test helper for collectives_test: a self-launched Fabric job (fabric.devices=WORLD on CPU).
//   collectives_helper WORLD check     every collective on Fabric, checked on every rank, and the
//                                       uneven-data metric (10 examples, batch 2), by hand and by
//                                       Fabric::evaluate: exits 0 if all hold; rank 0 prints
//                                       "metric=X"
//   collectives_helper WORLD nonfinite  NonFiniteGuard(limit 3) with NaN losses on the last rank
//                                       from step 7: every rank prints "rank R stopped at step 9"
//   collectives_helper WORLD stopsignal StopSignal(every 4): the last rank sends itself SIGTERM
//                                       at step 6: every rank prints "rank R stopped at step 8"
//   collectives_helper WORLD diverge    debug_collectives: rank 1's third collective is a broadcast
//                                       instead of an all_reduce (reshape: another shape)
//   collectives_helper WORLD threads [KEY=VALUE]  every rank prints "rank R threads T interop I
//                                       other thread O" (O: asked from a new thread; the
//                                       thread budget it runs with; FABRIC_CPUS,
//                                       OMP_NUM_THREADS and the override decide it)
//   collectives_helper WORLD skip      rank 1 calls all_reduce that rank 0 never joins (rank 0
//                                       waits for the job to be torn down): must end in a timeout
//                                       error naming the collective, not a hang
#include <signal.h>
#include <unistd.h>

#include <ATen/Parallel.h>
#include <torch/data/datasets/tensor.h>

#include <cstdio>
#include <thread>

#include "fabric/fabric.h"
#include "fabric/main.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/stop_signal.h"

namespace {

// Dataset of n examples; example i has data i and target i % 3.
class Counting : public fabric::Dataset {
 public:
  explicit Counting(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  fabric::Batch get_batch(const std::vector<int64_t>& indices) const override {
    auto idx = torch::tensor(indices, torch::kLong);
    return {idx.to(torch::kFloat).unsqueeze(1), idx.remainder(3)};
  }

 private:
  int64_t n_;
};

int check(fabric::Fabric& f) {
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(f.global_rank()), what);
      ++failures;
    }
  };
  const int64_t rank = f.global_rank(), world = f.world_size();
  expect(f.broadcast(std::string(rank == 1 ? "run-\0name" : "other", rank == 1 ? 9 : 5), 1) ==
             std::string("run-\0name", 9),
         "broadcast(string) from rank 1");
  expect(f.broadcast(std::string(rank == 0 ? "" : "x")).empty(), "broadcast(empty string)");
  expect(f.all_reduce(static_cast<double>(rank + 1), fabric::ReduceOp::kSum) ==
             world * (world + 1) / 2.0,
         "all_reduce(double, sum)");
  expect(f.all_reduce(static_cast<double>(rank), fabric::ReduceOp::kMax) == world - 1.0,
         "all_reduce(double, max)");
  expect(f.all_reduce(static_cast<double>(rank), fabric::ReduceOp::kMin) == 0.0,
         "all_reduce(double, min)");
  // Rank r contributes r + 1 rows of width 2 filled with r (first dimensions differ).
  auto parts = f.all_gather(torch::full({rank + 1, 2}, static_cast<double>(rank)));
  expect(static_cast<int64_t>(parts.size()) == world, "all_gather: one tensor per rank");
  for (int64_t r = 0; r < static_cast<int64_t>(parts.size()); ++r) {
    expect(parts[r].size(0) == r + 1 && parts[r].size(1) == 2, "all_gather: sizes kept");
    expect(parts[r].eq(static_cast<double>(r)).all().item<bool>(), "all_gather: values");
  }
  bool mismatch_caught = false;
  try {
    f.all_gather(torch::zeros({2, rank + 1}));
  } catch (const fabric::Error&) {
    mismatch_caught = true;
  }
  expect(mismatch_caught, "all_gather: differing trailing dimensions are an error");

  // Uneven data: 10 examples over the ranks, batch 2, no drop_last. "Accuracy" of predicting 0
  // must be the single-process value 4/10 (examples 0, 3, 6, 9), and every example is seen once.
  auto loader = f.setup_dataloader(Counting(10), fabric::DataLoaderOptions().batch_size(2));
  std::vector<torch::Tensor> mine;
  int64_t correct = 0, seen = 0;
  for (fabric::Batch& batch : loader) {
    mine.push_back(batch.unpadded(batch.data.squeeze(1)));
    correct += batch.unpadded(batch.target).eq(0).sum().item<int64_t>();
    seen += batch.size() - batch.padding;
  }
  const double metric = f.all_reduce(static_cast<double>(correct), fabric::ReduceOp::kSum) /
                        f.all_reduce(static_cast<double>(seen), fabric::ReduceOp::kSum);
  expect(metric == 0.4, "uneven metric equals the single-process value");
  auto everything = std::get<0>(torch::cat(f.all_gather(torch::cat(mine))).sort());
  expect(torch::equal(everything, torch::arange(10, torch::kFloat)),
         "gathered unpadded examples are each example exactly once");
  // Fabric::evaluate: the same metric in one call, and each example's index averaged (4.5), from
  // a torch::data dataset (fabric/data/torch_dataset.h) split over the ranks.
  auto torch_loader = f.setup_dataloader(
      torch::data::datasets::TensorDataset(torch::arange(10, torch::kFloat).unsqueeze(1)),
      fabric::DataLoaderOptions().batch_size(2));
  auto means = f.evaluate(loader, [](const fabric::Batch& b) {
    return std::map<std::string, torch::Tensor>{{"zero", b.target.eq(0)}};
  });
  auto index = f.evaluate(torch_loader, [](const fabric::Batch& b) {
    return std::map<std::string, torch::Tensor>{{"index", b.data.squeeze(1)}};
  });
  expect(means.at("zero") == 0.4 && means.at("examples") == 10 && index.at("index") == 4.5 &&
             index.at("examples") == 10,
         "evaluate: the single-process means");
  std::string wrong;
  try {
    f.evaluate(loader, [](const fabric::Batch& b) {
      return std::map<std::string, torch::Tensor>{{"loss", b.data.sum()}};
    });
  } catch (const fabric::Error& e) {
    wrong = e.what();
  }
  expect(wrong.find("'loss' holds 1 values for a batch of 2 examples") != std::string::npos,
         "evaluate: a value that is not per example is an error naming it");
  f.print("metric=", metric);
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return 2;
  const std::string world = argv[1], mode = argv[2];
  std::vector<std::string> overrides = {
      "fabric.accelerator=cpu", "fabric.devices=" + world, "fabric.ddp.timeout_s=3",
      std::string("fabric.ddp.debug_collectives=") +
          (mode == "diverge" || mode == "reshape" ? "true" : "false")};
  if (argc == 4) overrides.push_back(argv[3]);
  const auto config = fabric::Config::defaults(fabric::training_schema(), overrides);
  return fabric::run_main(1, argv, fabric::training_schema(), [&](const fabric::Config&) {
    fabric::Fabric fabric(config);
    int failures = 0;
    fabric.launch([&](fabric::Fabric& f) {
      if (mode == "nonfinite") {
        // The last rank's loss turns NaN from step 7 on; rank 0 has a short NaN run (steps 2-3,
        // shorter than the limit 3) that must not stop anything.
        fabric::NonFiniteGuard guard(f, 3);
        const int64_t last = f.world_size() - 1;
        for (int64_t step = 1; step <= 30; ++step) {
          const bool bad = (f.global_rank() == last && step >= 7) ||
                           (f.global_rank() == 0 && (step == 2 || step == 3));
          if (guard.update(torch::full({2}, bad ? NAN : 1.0), step)) {
            std::printf("rank %lld stopped at step %lld: %s\n",
                        static_cast<long long>(f.global_rank()), static_cast<long long>(step),
                        guard.message().c_str());
            std::fflush(stdout);
            return;
          }
        }
        std::printf("rank %lld never stopped\n", static_cast<long long>(f.global_rank()));
        return;
      }
      if (mode == "stopsignal") {
        fabric::StopSignal stop(f, 4);
        for (int64_t step = 1; step <= 40; ++step) {
          if (f.global_rank() == f.world_size() - 1 && step == 6) raise(SIGTERM);
          if (stop.requested(step)) {
            std::printf("rank %lld stopped at step %lld\n", static_cast<long long>(f.global_rank()),
                        static_cast<long long>(step));
            std::fflush(stdout);
            return;
          }
        }
        std::printf("rank %lld never stopped\n", static_cast<long long>(f.global_rank()));
        return;
      }
      if (mode == "diverge" || mode == "reshape") {
        // fabric.ddp.debug_collectives: the third collective differs on rank 1 (another kind, or
        // another shape); both ranks must fail right there, naming both sides.
        f.all_reduce(torch::ones({4}), fabric::ReduceOp::kSum);
        f.all_reduce(torch::ones({4}), fabric::ReduceOp::kSum);
        if (f.global_rank() == 1 && mode == "diverge") {
          f.broadcast(torch::ones({4}), 0);
        } else {
          f.all_reduce(torch::ones({f.global_rank() == 1 ? 5 : 4}), fabric::ReduceOp::kSum);
        }
        std::printf("rank %lld passed the divergence\n", static_cast<long long>(f.global_rank()));
        return;
      }
      if (mode == "threads") {
        // Asked from another thread too: LibTorch keeps the count process-wide (OpenMP's own
        // setting is per thread), so loader and graph threads run with the same budget.
        int other_thread = 0;
        std::thread([&] { other_thread = at::get_num_threads(); }).join();
        f.barrier();
        std::printf("rank %lld threads %d interop %d other thread %d\n",
                    static_cast<long long>(f.global_rank()), at::get_num_threads(),
                    static_cast<int>(at::get_num_interop_threads()), other_thread);
        std::fflush(stdout);
        return;
      }
      if (mode == "skip") {
        if (f.global_rank() == 1) f.all_reduce(torch::ones({1}), fabric::ReduceOp::kSum);
        for (;;) pause();  // rank 0: torn down by the launcher when rank 1 fails
      }
      failures = check(f);
    });
    return failures == 0 ? 0 : 1;
  });
}
