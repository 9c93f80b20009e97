// bazel run //tools/bench:overhead [-- --reps=15 --steps=200 --json=FILE]
//
// Fabric's per-step overhead: the same tiny-MLP training loop (CPU, one process, 32-true) run
// through Fabric (setup, setup_dataloader, autocast, backward, step) and written directly on
// LibTorch (index_select batches, backward, step), in interleaved repetitions so that machine
// drift hits both alike. --workers: the loader's num_workers (default -1, the library's automatic
// choice); --threads: intra-op threads of both loops (default 1, set through fabric.num_threads so
// Fabric's thread budget keeps it). Prints each repetition and the median step-time ratio
// fabric/raw (goal <= 1.01); --json writes the numbers. Not a test: timings are never asserted.
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fabric/fabric.h"

namespace {

using Clock = std::chrono::steady_clock;

torch::nn::Sequential make_mlp() {
  return torch::nn::Sequential(torch::nn::Linear(32, 128), torch::nn::ReLU(),
                               torch::nn::Linear(128, 128), torch::nn::ReLU(),
                               torch::nn::Linear(128, 10));
}

struct Data {
  torch::Tensor x, y;
};

Data make_data(int64_t n) {
  torch::manual_seed(0);
  return {torch::randn({n, 32}), torch::randint(0, 10, {n})};
}

// Seconds per step over `steps` steps of the hand-written loop.
double raw_loop(const Data& d, int64_t steps, int64_t batch) {
  torch::manual_seed(1);
  auto model = make_mlp();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  fabric::DistributedSampler sampler(d.x.size(0), 1, 0, true, 1);
  const auto start = Clock::now();
  int64_t done = 0;
  for (int64_t epoch = 0; done < steps; ++epoch) {
    sampler.set_epoch(epoch);
    const auto order = torch::tensor(sampler.indices(), torch::kLong);
    for (int64_t b = 0; b + batch <= order.size(0) && done < steps; b += batch, ++done) {
      const auto idx = order.slice(0, b, b + batch);
      opt.zero_grad();
      auto loss = torch::cross_entropy_loss(model->forward(d.x.index_select(0, idx)),
                                            d.y.index_select(0, idx));
      loss.backward();
      opt.step();
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(steps);
}

// Seconds per step of the same loop through Fabric.
double fabric_loop(fabric::Fabric& fabric, const Data& d, int64_t steps, int64_t batch,
                   int64_t workers) {
  double seconds = 0;
  fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(1);
    auto model = make_mlp();
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
    f.setup(model, opt);
    auto loader = f.setup_dataloader(
        fabric::TensorDataset(d.x, d.y),
        fabric::DataLoaderOptions().batch_size(batch).shuffle(true).drop_last(true).num_workers(
            workers));
    const auto start = Clock::now();
    int64_t done = 0;
    while (done < steps) {
      for (fabric::Batch& b : loader) {
        if (done++ >= steps) break;
        opt.zero_grad();
        torch::Tensor loss;
        {
          auto guard = f.autocast();
          loss = torch::cross_entropy_loss(model->forward(b.data), b.target);
        }
        f.backward(loss);
        f.step(opt);
      }
    }
    seconds =
        std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(steps);
  });
  return seconds;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t reps = 15, steps = 200, batch = 64, workers = -1, threads = 1;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* name) { return a.substr(std::string(name).size()); };
    if (a.rfind("--reps=", 0) == 0)
      reps = std::stoll(value("--reps="));
    else if (a.rfind("--steps=", 0) == 0)
      steps = std::stoll(value("--steps="));
    else if (a.rfind("--batch=", 0) == 0)
      batch = std::stoll(value("--batch="));
    else if (a.rfind("--workers=", 0) == 0)
      workers = std::stoll(value("--workers="));
    else if (a.rfind("--threads=", 0) == 0)
      threads = std::stoll(value("--threads="));
    else if (a.rfind("--json=", 0) == 0)
      json_path = value("--json=");
    else {
      std::fprintf(stderr,
                   "usage: overhead [--reps=N] [--steps=N] [--batch=N] [--workers=N] [--threads=N] "
                   "[--json=FILE]\n");
      return 2;
    }
  }
  if (threads > 0) at::set_num_threads(static_cast<int>(threads));  // 0: Fabric's budget for both
  const Data data = make_data(8192);
  fabric::Fabric fabric(fabric::Config::defaults(
      fabric::training_schema(),
      {"fabric.accelerator=cpu", "fabric.num_threads=" + std::to_string(threads)}));
  raw_loop(data, steps / 4, batch);  // warm-up both paths (allocator, lazy init)
  fabric_loop(fabric, data, steps / 4, batch, workers);

  std::vector<double> raw, fab, ratio;
  std::printf("%4s %14s %14s %8s\n", "rep", "raw us/step", "fabric us/step", "ratio");
  for (int64_t r = 0; r < reps; ++r) {
    // Alternate which runs first so neither always follows the other.
    double a, b;
    if (r % 2 == 0) {
      a = raw_loop(data, steps, batch);
      b = fabric_loop(fabric, data, steps, batch, workers);
    } else {
      b = fabric_loop(fabric, data, steps, batch, workers);
      a = raw_loop(data, steps, batch);
    }
    raw.push_back(a);
    fab.push_back(b);
    ratio.push_back(b / a);
    std::printf("%4lld %14.1f %14.1f %8.4f\n", static_cast<long long>(r), a * 1e6, b * 1e6, b / a);
  }
  const double m = median(ratio);
  std::printf("median: raw %.1f us/step, fabric %.1f us/step, ratio %.4f (goal <= 1.01)\n",
              median(raw) * 1e6, median(fab) * 1e6, m);
  if (!json_path.empty()) {
    nlohmann::json j = {{"benchmark", "overhead"}, {"reps", reps},
                        {"steps", steps},          {"batch", batch},
                        {"workers", workers},      {"threads", threads},
                        {"raw_s_per_step", raw},   {"fabric_s_per_step", fab},
                        {"ratio", ratio},          {"median_ratio", m}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}
