// bazel run //tools/bench:lora_step -- --model=DIR [--threads=N] [--warmup=3] [--steps=10]
//     [--batch=8] [--seq=256] [--rank=8] [--alpha=16] [--targets=q_proj,k_proj,v_proj,o_proj]
//     [--lr=1e-3] [--seed=0] [--save_adapter=DIR] [--profile=DIR]
//
// One LoRA fine-tuning step (on CPU, or --device=cuda) through Fabric's default path, timed against
// Hugging Face peft by tools/bench/lora_step_peft.py (the same step in PyTorch; docs/benchmarks.md,
// "LoRA fine-tuning step on CPU"). The Hugging Face Llama folder --model
// (tools/bench/make_bench_llama.py writes one) loads as float32 (fabric.precision 32-true, CPU);
// apply_lora puts adapters of
// --rank, --alpha and dropout 0 on the --targets layers; fabric::AdamW (fused, the default
// implementation; lr --lr, weight decay 0.01 as torch.optim.AdamW's) trains the adapters only.
// The batch: --batch windows of --seq + 1 random token ids from torch::manual_seed(--seed), the
// same ids torch.manual_seed + torch.randint give in Python; inputs are the first --seq ids,
// targets the next ones. Each step: forward, loss = mean cross-entropy over every position,
// Fabric's backward and step, zero_grad. --warmup steps run untimed, then --steps timed ones.
//
// --device=cuda --precision=bf16-mixed: the same on one GPU under bf16 autocast (the weights
// float32), the GPU row of issue 70 (tools/bench/llama_gpu_bench.sh ours-lora); "peak_mib" in
// the result is the most tensor memory held (CUDA; null on the CPU).
// --threads: fabric.num_threads (intra- and inter-op threads); without it Fabric picks (OMP_NUM_
// THREADS, else the CPUs this process may use). --save_adapter writes the initial adapter (before
// any step) in peft's format, so lora_step_peft.py --load_adapter starts from the same weights
// and every step's loss can be compared. --profile writes a trace of 3 timed steps with
// fabric::StepProfiler and prints its op table to stderr.
//
// Prints one line: RESULT {"impl", "threads", "batch", "seq", "tokens_per_s" (batch·seq over
// the median step), "step_ms_median", "step_ms_min", "trainable_params", "loss0" (the first
// step's loss: the base model's, since lora_B starts at zero), "loss" (the last step's),
// "losses" (every step's, warm-up included), "tokens_sum" (a check that both sides use the
// same ids)}.
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/accelerators/memory.h"
#include "fabric/fabric.h"
#include "fabric/hf/llama.h"
#include "fabric/nn/lora.h"
#include "fabric/training/fast_optimizers.h"
#include "fabric/training/profiler.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, save_adapter, profile, device = "cpu", precision = "32-true";
  int64_t threads = 0, warmup = 3, steps = 10, batch = 8, seq = 256, rank = 8, seed = 0;
  double alpha = 16, lr = 1e-3;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

const char kUsage[] =
    "usage: lora_step --model=DIR [--threads=N] [--warmup=N] [--steps=N] [--batch=N] [--seq=N] "
    "[--rank=N] [--alpha=X] [--targets=a,b] [--lr=X] [--seed=N] [--save_adapter=DIR] "
    "[--profile=DIR] [--device=cpu|cuda] [--precision=32-true|bf16-mixed]\n";

std::optional<Args> parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const size_t eq = s.find('=');
    if (s.rfind("--", 0) != 0 || eq == std::string::npos) return std::nullopt;
    const std::string key = s.substr(2, eq - 2), v = s.substr(eq + 1);
    if (key == "model")
      a.model = v;
    else if (key == "save_adapter")
      a.save_adapter = v;
    else if (key == "profile")
      a.profile = v;
    else if (key == "device")
      a.device = v;
    else if (key == "precision")
      a.precision = v;
    else if (key == "threads")
      a.threads = std::stoll(v);
    else if (key == "warmup")
      a.warmup = std::stoll(v);
    else if (key == "steps")
      a.steps = std::stoll(v);
    else if (key == "batch")
      a.batch = std::stoll(v);
    else if (key == "seq")
      a.seq = std::stoll(v);
    else if (key == "rank")
      a.rank = std::stoll(v);
    else if (key == "seed")
      a.seed = std::stoll(v);
    else if (key == "alpha")
      a.alpha = std::stod(v);
    else if (key == "lr")
      a.lr = std::stod(v);
    else if (key == "targets")
      a.targets = split(v);
    else
      return std::nullopt;
  }
  if (a.model.empty() || a.steps < 1 || a.warmup < 0) return std::nullopt;
  return a;
}

// The user's relative paths are relative to where they typed the command (bazel run runs in
// the runfiles tree).
std::string resolve(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || !cwd) return path;
  return std::string(cwd) + "/" + path;
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = parse(argc, argv);
  if (!parsed) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  Args args = *parsed;
  args.model = resolve(args.model);
  args.save_adapter = resolve(args.save_adapter);
  args.profile = resolve(args.profile);

  std::vector<std::string> overrides = {"fabric.accelerator=" + args.device, "fabric.devices=1",
                                        "fabric.precision=" + args.precision};
  if (args.threads > 0) overrides.push_back("fabric.num_threads=" + std::to_string(args.threads));
  fabric::Fabric fabric(fabric::Config::defaults(fabric::training_schema(), overrides));

  nlohmann::json result;
  fabric.launch([&](fabric::Fabric& f) {
    fabric::models::Llama model = fabric::hf::load_llama(args.model);
    fabric::nn::LoraOptions lora;
    lora.rank = args.rank;
    lora.alpha = args.alpha;
    lora.dropout = 0;
    lora.target_modules = args.targets;
    fabric::nn::apply_lora(*model, lora);
    if (!args.save_adapter.empty())
      fabric::nn::save_lora_adapter(*model, args.save_adapter, lora, args.model);

    // The optimizer over the adapters only, as peft's users pass model.parameters() filtered by
    // requires_grad.
    std::vector<torch::Tensor> trainable;
    int64_t trainable_params = 0;
    for (const auto& p : model->parameters()) {
      if (!p.requires_grad()) continue;
      trainable.push_back(p);
      trainable_params += p.numel();
    }
    fabric::AdamW optimizer(trainable, torch::optim::AdamWOptions(args.lr).weight_decay(0.01),
                            fabric::OptimizerImpl::kFused);
    f.setup(model, optimizer);
    model->train();

    torch::manual_seed(static_cast<uint64_t>(args.seed));
    const int64_t vocab = model->config().vocab_size;
    const torch::Tensor ids = torch::randint(0, vocab, {args.batch, args.seq + 1}, torch::kLong);
    const torch::Tensor x = ids.narrow(1, 0, args.seq).contiguous().to(f.device());
    const torch::Tensor y = ids.narrow(1, 1, args.seq).contiguous().to(f.device());

    std::unique_ptr<fabric::StepProfiler> profiler;
    if (!args.profile.empty()) {
      fabric::StepProfilerOptions o;
      o.wait = args.warmup;  // the warm-up steps, then one profiler warm-up step, then 3 recorded
      o.warmup = 1;
      o.active = 3;
      o.dir = args.profile;
      profiler = std::make_unique<fabric::StepProfiler>(o);
    }
    std::vector<double> losses, step_ms;
    for (int64_t i = 0; i < args.warmup + args.steps; ++i) {
      const auto start = Clock::now();
      torch::Tensor loss;
      {
        auto guard = f.autocast();  // --precision bf16-mixed: bf16 compute, float32 weights
        loss = model->loss(x, y);
      }
      f.backward(loss);
      f.step(optimizer);
      optimizer.zero_grad();
      const double loss_value = loss.item<double>();
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      losses.push_back(loss_value);
      if (i >= args.warmup) step_ms.push_back(ms);
      if (profiler) profiler->step();
    }
    if (profiler) std::cerr << profiler->table();

    std::vector<double> sorted = step_ms;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
    result = {{"impl", "fabric"},
              {"threads", at::get_num_threads()},
              {"batch", args.batch},
              {"seq", args.seq},
              {"tokens_per_s", static_cast<double>(args.batch * args.seq) / (median / 1e3)},
              {"step_ms_median", median},
              {"step_ms_min", sorted.front()},
              {"trainable_params", trainable_params},
              {"loss0", losses.front()},
              {"loss", losses.back()},
              {"losses", losses},
              {"tokens_sum", ids.sum().item<int64_t>()},
              {"device", f.device().str()},
              {"precision", args.precision},
              {"peak_mib",
               fabric::memory_counted(f.device())
                   ? nlohmann::json(static_cast<double>(fabric::memory_stats(f.device()).peak) /
                                    (1 << 20))
                   : nlohmann::json(nullptr)}};
  });
  std::cout << "RESULT " << result.dump() << std::endl;
  return 0;
}
