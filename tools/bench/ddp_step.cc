// 2-rank CPU DDP step time through Fabric (self-launched ranks, c10d::Reducer; all-reduces through
// shared memory unless --cpu_backend=gloo), for the
// comparison with PyTorch's Python DDP in ddp_compare.py (same model, batch, threads, steps).
//   ddp_step --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
// Model: MLP 1024 → 2048 → 1024 → 512 (ReLU), 4.72M parameters, MSE loss, SGD momentum 0.9.
// Optimizer: fabric::SGD with --optimizer_impl (default auto = fused; for_loop is torch::optim's).
// Rank 0 prints "ddp_step_ms median=X mean=Y" (per-step wall time, after warm-up) and
// "peak_rss_mib=Z" (its own peak resident set).
#include <gflags/gflags.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>

#include "fabric/fabric.h"

DEFINE_int32(world, 2, "processes");
DEFINE_int32(steps, 60, "timed steps");
DEFINE_int32(warmup, 10, "untimed steps first");
DEFINE_int32(batch, 64, "batch per rank");
DEFINE_int32(threads, 1, "intra-op threads per rank");
DEFINE_double(bucket_cap_mb, 25.0, "DDP bucket size");
DEFINE_string(optimizer_impl, "auto", "auto | fused | foreach | for_loop");
DEFINE_string(cpu_backend, "auto",
              "fabric.ddp.cpu_backend: auto (shared memory here) | gloo | shm");

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  at::set_num_threads(FLAGS_threads);
  const auto config = fabric::Config::defaults(
      fabric::training_schema(),
      {"fabric.accelerator=cpu", "fabric.devices=" + std::to_string(FLAGS_world),
       "fabric.strategy=ddp", "fabric.ddp.bucket_cap_mb=" + std::to_string(FLAGS_bucket_cap_mb),
       "fabric.ddp.cpu_backend=" + FLAGS_cpu_backend});
  fabric::Fabric fabric(config);
  return fabric.launch([&](fabric::Fabric& f) {
    torch::nn::Sequential model(torch::nn::Linear(1024, 2048), torch::nn::ReLU(),
                                torch::nn::Linear(2048, 1024), torch::nn::ReLU(),
                                torch::nn::Linear(1024, 512));
    fabric::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9),
                    fabric::parse_optimizer_impl(FLAGS_optimizer_impl));
    f.setup(model, opt);
    auto x = torch::randn({FLAGS_batch, 1024});
    auto y = torch::randn({FLAGS_batch, 512});
    std::vector<double> ms;
    for (int s = 0; s < FLAGS_warmup + FLAGS_steps; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      opt.zero_grad();
      f.backward(torch::mse_loss(model->forward(x), y));
      f.step(opt);
      const auto t1 = std::chrono::steady_clock::now();
      if (s >= FLAGS_warmup)
        ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    if (f.is_global_zero()) {
      std::printf("ddp_step_ms median=%.3f mean=%.3f\n", ms[ms.size() / 2],
                  std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size()));
      rusage usage{};
      getrusage(RUSAGE_SELF, &usage);
      std::printf("peak_rss_mib=%.1f\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
    }
  });
}
