// 2-rank CPU DDP step time through Fabric (self-launched ranks, c10d::Reducer; all-reduces through
// shared memory unless --cpu_backend=gloo), for the
// comparison with PyTorch's Python DDP in ddp_compare.py (same model, batch, threads, steps).
//   ddp_step --world=2 --steps=60 --warmup=10 --batch=64 --threads=1
//   [--model=mlp|resnet18|gpt-tiny]
//            [--precision=32-true|bf16-mixed] [--optimizer_impl=auto]
// Models: mlp = MLP 1024 → 2048 → 1024 → 512 (ReLU), 4.72M parameters, MSE loss, SGD lr 0.01
// momentum 0.9; resnet18 = the main job's ResNet-18 CIFAR (examples/common/models.h, plain
// BatchNorm), 3x32x32 inputs, cross-entropy, SGD lr 0.1 momentum 0.9 Nesterov weight decay 5e-4;
// gpt-tiny = fabric::models::GPT's tiny preset (858,880 parameters), --batch sequences of 256
// random token ids, GPT::loss, SGD lr 0.01 momentum 0.9.
// Optimizer: fabric::SGD with --optimizer_impl (default auto = fused; for_loop is torch::optim's).
// --threads=0 leaves the threads to Fabric (its default: CPUs / ranks).
// --shard_optimizer_state: fabric.ddp.shard_optimizer_state (ZeRO-1).
// --fsdp=full_shard|shard_grad_op: fabric.strategy=fsdp with that sharding strategy; units by
// --wrap_modules (default Linear: the MLP's three layers; ResNet-18's convolutions and fc with
// Conv2d,Linear) and --min_unit_params (default 0: off).
// Rank 0 prints "ddp_step_ms median=X mean=Y" (per-step wall time, after warm-up),
// "peak_rss_mib=Z" (its own peak resident set) and "state_mib parameters=P gradients=G
// optimizer=O" (its distinct storages of each kind after the last step).
#include <gflags/gflags.h>
#include <sys/resource.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <optional>
#include <type_traits>

#include "examples/common/models.h"
#include "fabric/fabric.h"
#include "fabric/models/gpt.h"
#include "fabric/training/optimizers.h"
#include "fabric/training/profiler.h"
#include "fabric/training/state_bytes.h"

DEFINE_int32(world, 2, "processes");
DEFINE_int32(steps, 60, "timed steps");
DEFINE_int32(warmup, 10, "untimed steps first");
DEFINE_int32(batch, 64, "batch per rank");
DEFINE_int32(threads, 1, "intra-op threads per rank (0: Fabric's default)");
DEFINE_string(model, "mlp", "mlp | resnet18");
DEFINE_string(precision, "32-true", "fabric.precision: 32-true | bf16-mixed");
DEFINE_double(bucket_cap_mb, 25.0, "DDP bucket size");
DEFINE_string(optimizer_impl, "auto", "auto | fused | foreach | for_loop");
DEFINE_bool(shard_optimizer_state, false, "fabric.ddp.shard_optimizer_state (ZeRO-1)");
DEFINE_string(fsdp, "", "fabric.strategy=fsdp with this sharding strategy (empty: ddp)");
DEFINE_string(wrap_modules, "Linear", "fabric.fsdp.wrap_modules");
DEFINE_int64(min_unit_params, 0, "fabric.fsdp.min_unit_params");
DEFINE_string(prefetch, "auto", "fabric.fsdp.prefetch (auto|true|false)");
DEFINE_string(param_dtype, "auto", "fabric.fsdp.param_dtype (auto|fp32|bf16|fp16)");
DEFINE_string(reduce_dtype, "auto", "fabric.fsdp.reduce_dtype (auto|fp32|bf16|fp16)");
DEFINE_string(cpu_backend, "auto",
              "fabric.ddp.cpu_backend: auto (shared memory here) | gloo | shm");
DEFINE_bool(profile, false,
            "record the timed steps with LibTorch's profiler; rank 0 prints its ops by self CPU "
            "time (ddp_step.py --profile prints PyTorch's)");
DEFINE_int32(profile_rows, 30, "rows of the --profile table");

void print_state(torch::nn::Module& model, const torch::optim::Optimizer& opt) {
  const fabric::StateBytes b = fabric::state_bytes(model, opt);
  constexpr double kMib = 1024.0 * 1024.0;
  std::printf("state_mib parameters=%.2f gradients=%.2f optimizer=%.2f\n", b.parameters / kMib,
              b.gradients / kMib, b.optimizer / kMib);
}

template <typename Model>
int time_steps(fabric::Fabric& f, Model& model, const torch::optim::SGDOptions& options) {
  fabric::SGD opt(model->parameters(), options, fabric::parse_optimizer_impl(FLAGS_optimizer_impl));
  f.setup(model, opt);
  model->train();
  const bool resnet = FLAGS_model == "resnet18", gpt = FLAGS_model == "gpt-tiny";
  torch::Tensor x, y;
  if (gpt) {
    const torch::Tensor w = torch::randint(0, 256, {FLAGS_batch, 257});
    x = w.narrow(1, 0, 256);
    y = w.narrow(1, 1, 256);
  } else {
    x = resnet ? torch::randn({FLAGS_batch, 3, 32, 32}) : torch::randn({FLAGS_batch, 1024});
    y = resnet ? torch::randint(0, 10, {FLAGS_batch}) : torch::randn({FLAGS_batch, 512});
  }
  std::vector<double> ms;
  std::optional<fabric::StepProfiler> profiler;
  if (FLAGS_profile) {
    fabric::StepProfilerOptions o;
    o.wait = std::max(0, FLAGS_warmup - 1);
    o.warmup = FLAGS_warmup > 0 ? 1 : 0;
    o.active = FLAGS_steps;
    o.dir = "/tmp/ddp_step_profile";
    o.rank = f.global_rank();
    o.row_limit = FLAGS_profile_rows;
    profiler.emplace(o);
  }
  for (int s = 0; s < FLAGS_warmup + FLAGS_steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    torch::Tensor loss;
    {
      auto autocast = f.autocast();
      if constexpr (std::is_same_v<Model, fabric::models::GPT>) {
        loss = model->loss(x, y);
      } else {
        loss = resnet ? torch::cross_entropy_loss(model->forward(x), y)
                      : torch::mse_loss(model->forward(x), y);
      }
    }
    f.backward(loss);
    f.step(opt);
    const auto t1 = std::chrono::steady_clock::now();
    if (s >= FLAGS_warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    if (profiler) profiler->step();
  }
  if (profiler && f.is_global_zero()) std::printf("%s", profiler->table().c_str());
  std::sort(ms.begin(), ms.end());
  if (f.is_global_zero()) {
    std::printf("ddp_step_ms median=%.3f mean=%.3f\n", ms[ms.size() / 2],
                std::accumulate(ms.begin(), ms.end(), 0.0) / static_cast<double>(ms.size()));
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    std::printf("peak_rss_mib=%.1f\n", static_cast<double>(usage.ru_maxrss) / 1024.0);
    print_state(*model, opt);
  }
  return 0;
}

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_profile && FLAGS_warmup < 1) {
    std::fprintf(stderr,
                 "ddp_step: --profile needs --warmup of at least 1 (the profiler warms up "
                 "on the last untimed step)\n");
    return 2;
  }
  if (FLAGS_model != "mlp" && FLAGS_model != "resnet18" && FLAGS_model != "gpt-tiny") {
    std::fprintf(stderr, "ddp_step: --model must be mlp, resnet18 or gpt-tiny, not '%s'\n",
                 FLAGS_model.c_str());
    return 2;
  }
  const auto config = fabric::Config::defaults(
      fabric::training_schema(),
      {"fabric.accelerator=cpu", "fabric.devices=" + std::to_string(FLAGS_world),
       FLAGS_fsdp.empty() ? "fabric.strategy=ddp" : "fabric.strategy=fsdp",
       "fabric.fsdp.sharding_strategy=" + (FLAGS_fsdp.empty() ? "full_shard" : FLAGS_fsdp),
       "fabric.fsdp.wrap_modules=" + FLAGS_wrap_modules,
       "fabric.fsdp.min_unit_params=" + std::to_string(FLAGS_min_unit_params),
       "fabric.fsdp.prefetch=" + FLAGS_prefetch, "fabric.fsdp.param_dtype=" + FLAGS_param_dtype,
       "fabric.fsdp.reduce_dtype=" + FLAGS_reduce_dtype,
       "fabric.ddp.bucket_cap_mb=" + std::to_string(FLAGS_bucket_cap_mb),
       "fabric.ddp.cpu_backend=" + FLAGS_cpu_backend, "fabric.precision=" + FLAGS_precision,
       "fabric.num_threads=" + std::to_string(FLAGS_threads),
       std::string("fabric.ddp.shard_optimizer_state=") +
           (FLAGS_shard_optimizer_state ? "true" : "false")});
  fabric::Fabric fabric(config);
  return fabric.launch([&](fabric::Fabric& f) {
    if (FLAGS_model == "resnet18") {
      examples::ResNet18Cifar model;
      return time_steps(
          f, model, torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4));
    }
    if (FLAGS_model == "gpt-tiny") {
      fabric::models::GPT model(fabric::models::GPTConfig::preset("tiny"));
      return time_steps(f, model, torch::optim::SGDOptions(0.01).momentum(0.9));
    }
    torch::nn::Sequential model(torch::nn::Linear(1024, 2048), torch::nn::ReLU(),
                                torch::nn::Linear(2048, 1024), torch::nn::ReLU(),
                                torch::nn::Linear(1024, 512));
    return time_steps(f, model, torch::optim::SGDOptions(0.01).momentum(0.9));
  });
}
