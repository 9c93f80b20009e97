// Training throughput through Fabric, the C++ side of tools/bench/gpu_compare.py (the Python side
// is tools/bench/throughput.py: same models, optimizer hyperparameters, loss and data; ours runs
// --optimizer_impl, the Python side each framework's default implementation) and, for the GPT, of
// tools/bench/gpt_reference.py (the identical model, init, AdamW and data in PyTorch: eager and
// torch.compile).
//   throughput --model=resnet18|resnet50|gpt2[-medium|-large|-xl]|gpt-tiny --batch=512
//              --precision=bf16-mixed [--fp8_recipe=tensorwise] [--steps=50]
//              [--warmup=15] [--data=static|epoch --images=50000] [--channels_last]
//              [--accelerator=cuda] [--optimizer_impl=auto] [--threads=0] [--cuda_graphs]
//              [--accumulate=1] [--fp8_weight_cache=true]
//              [--profile=trace.json --profile_steps=8] [--sync_debug] [--data_only]
// static: a pool of 4 synthetic normalized float batches on the device, cycled. epoch: a synthetic
// uint8 dataset of --images images kept on the device (fabric::device_dataset), shuffled, random
// crop (pad 4) + flip + normalize on the device (fabric::crop_flip_normalize); one whole epoch is
// timed after --warmup steps. Prints one line: RESULT {"images_per_s": ..., "step_ms": ...,
// "peak_device_mib": ..., "peak_rss_mib": ...} (JSON).
// The GPT models (fabric::models::GPT presets; --batch sequences of --seq tokens, random token ids
// cycled from a pool of 4 batches on the device) train with AdamW (lr 6e-4, betas 0.9/0.95, weight
// decay 0.1 on matrices only, --optimizer_impl) and the next-token loss; the RESULT line adds
// tokens_per_s, tflops (GPTConfig::flops_per_token · tokens/s) and mfu (of --peak_tflops).
#include <gflags/gflags.h>
#include <sys/resource.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <string>
#include <vector>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <torch/cuda.h>
#endif

#include "examples/common/models.h"
#include "fabric/data/augment.h"
#include "fabric/fabric.h"
#include "fabric/graphed_step.h"
#include "fabric/models/gpt.h"
#include "fabric/nn/fp8.h"
#include "fabric/training/activation_checkpoint.h"
#include "fabric/training/optimizers.h"
#include "tools/bench/resnet50.h"

DEFINE_string(
    model, "resnet18",
    "resnet18 (CIFAR variant) | resnet50 (ImageNet stem) | gpt2 | gpt2-medium | gpt2-large | "
    "gpt2-xl | gpt-tiny");
DEFINE_int32(seq, 0, "GPT models: tokens per sequence (0: the preset's block_size)");
DEFINE_bool(fused_loss, true,
            "GPT models: the output layer + cross-entropy as one fused CUDA step (GPT::loss)");
DEFINE_bool(fused_layer_norm, true,
            "GPT models: LayerNorms (+ residual add) as fused CUDA kernels (GPTConfig)");
DEFINE_bool(activation_checkpointing, false,
            "GPT models: recompute every Block's activations in backward "
            "(model.activation_checkpointing: [Block])");
DEFINE_int32(
    accumulate, 1,
    "GPT models: micro-batches of --batch per optimizer step (trainer.accumulate_grad_batches; "
    "a timed step is all of them)");
DEFINE_bool(fp8_weight_cache, true,
            "fp8-mixed: keep each weight's float8 cast while the weight is unchanged "
            "(fabric::nn::set_fp8_weight_cache; false: cast every micro-batch)");
DEFINE_double(clip, 0.0, "GPT models: clip the gradient norm at this value (0: no clipping)");
DEFINE_double(peak_tflops, 989.0,
              "GPT models: the device's dense peak for MFU (989: H100/H200 SXM bf16)");
DEFINE_int32(batch, 512, "batch size");
DEFINE_string(precision, "32-true", "32-true | bf16-mixed | 16-mixed | fp8-mixed");
DEFINE_string(fp8_recipe, "tensorwise",
              "fp8-mixed scales: tensorwise | rowwise | delayed (fabric.fp8.recipe)");
DEFINE_string(fp8_exclude, "", "fp8-mixed: fabric.fp8.exclude_modules (e.g. auto_filter_small_kn)");
DEFINE_bool(fp8_fast_accumulation, true,
            "fp8-mixed: fabric.fp8.fast_accumulation (false: every GEMM accumulates precisely)");
DEFINE_int32(steps, 50, "timed steps (data=static)");
DEFINE_int32(warmup, 15, "untimed steps first");
DEFINE_string(data, "static", "static | epoch");
DEFINE_int32(images, 50000, "dataset size for data=epoch");
DEFINE_bool(channels_last, false, "fabric.channels_last");
DEFINE_bool(cuda_graphs, false, "fabric.cuda_graphs: replay each step as a CUDA graph");
DEFINE_string(accelerator, "cuda", "cuda | cpu");
DEFINE_string(optimizer_impl, "auto", "auto | fused | foreach | for_loop");
DEFINE_bool(sync_debug, false,
            "diagnosis: warn at every call that synchronizes the host with the GPU during the "
            "timed steps (c10's CUDA sync debug mode)");
DEFINE_bool(data_only, false, "diagnosis: time producing the batches alone (no training step)");
DEFINE_string(profile, "",
              "diagnosis: write a Chrome trace (CPU ops, CUDA runtime calls and kernels) of "
              "--profile_steps timed steps, from timed step 20 on, to this path "
              "(tools/bench/trace_summary.py reads it)");
DEFINE_int32(profile_steps, 8, "steps the --profile trace covers");
DEFINE_int32(threads, 0,
             "CPU intra-op threads, as fabric.num_threads (0: Fabric's default, the usable CPUs); "
             "an at::set_num_threads here would be overridden by Fabric's thread budget");

namespace {

const std::vector<double> kMean{0.4914, 0.4822, 0.4465}, kStd{0.2470, 0.2435, 0.2616};

void synchronize(const torch::Device& device) {
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
#endif
}

void reset_peak_memory(const torch::Device& device) {
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

// MiB allocated on the device: the peak since reset_peak_memory, or now.
double device_mib(const torch::Device& device, bool peak) {
#ifdef FABRIC_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& s =
        stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return static_cast<double>(peak ? s.peak : s.current) / (1 << 20);
  }
#endif
  return 0.0;
}
double peak_device_mib(const torch::Device& device) { return device_mib(device, true); }

// What stayed allocated between steps when the timed ones began (weights, gradients, optimizer
// state): the peak minus it is what one step adds (activations, temporaries).
double g_start_device_mib = 0;

// The Kineto profiler around a window of steps (--profile): synchronized at both ends so the
// trace holds whole steps.
std::set<torch::profiler::impl::ActivityType> profile_activities(const torch::Device& device) {
  std::set<torch::profiler::impl::ActivityType> activities{
      torch::profiler::impl::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(torch::profiler::impl::ActivityType::CUDA);
  return activities;
}

void start_profile(const torch::Device& device) {
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  synchronize(device);
  torch::autograd::profiler::prepareProfiler(config, profile_activities(device));
  torch::autograd::profiler::enableProfiler(config, profile_activities(device));
}

void stop_profile(const torch::Device& device, const std::string& path) {
  synchronize(device);
  torch::autograd::profiler::disableProfiler()->save(path);
  std::fprintf(stderr, "throughput: wrote the trace %s\n", path.c_str());
}

// Runs `train_step` `steps` times after a device synchronization and returns the seconds until
// the device finished; --profile and --sync_debug apply here.
double timed(const torch::Device& device, int64_t steps, const std::function<void()>& train_step) {
  synchronize(device);
  reset_peak_memory(device);
  g_start_device_mib = device_mib(device, false);
  const auto t0 = std::chrono::steady_clock::now();
#ifdef FABRIC_WITH_CUDA
  if (FLAGS_sync_debug)
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
#endif
  const int64_t profile_from = std::min<int64_t>(20, steps / 2);
  const int64_t profile_to = std::min<int64_t>(steps, profile_from + FLAGS_profile_steps);
  for (int64_t s = 0; s < steps; ++s) {
    if (!FLAGS_profile.empty() && s == profile_from) start_profile(device);
    {
      RECORD_USER_SCOPE("train_step");  // marks the steps in a --profile trace
      train_step();
    }
    if (!FLAGS_profile.empty() && s + 1 == profile_to) stop_profile(device, FLAGS_profile);
  }
#ifdef FABRIC_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
#endif
  synchronize(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

template <typename Model>
int run(fabric::Fabric& f, Model& model) {
  const torch::Device device = f.device();
  fabric::SGD opt(model->parameters(),
                  torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(5e-4),
                  fabric::parse_optimizer_impl(FLAGS_optimizer_impl));
  f.setup(model, opt);
  model->train();
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();

  auto gen = at::detail::createCPUGenerator(0);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> pool;
  std::unique_ptr<fabric::DataLoader> loader;
  int64_t timed_steps = FLAGS_steps;
  if (FLAGS_data == "static") {
    for (int i = 0; i < 4; ++i) {
      auto x = torch::randn({FLAGS_batch, 3, 32, 32}, gen);
      if (FLAGS_channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
      pool.emplace_back(x.to(device), torch::randint(0, 10, {FLAGS_batch}, gen).to(device));
    }
  } else {
    fabric::TensorDataset cpu(
        torch::randint(0, 256, {FLAGS_images, 3, 32, 32}, gen, torch::kLong).to(torch::kUInt8),
        torch::randint(0, 10, {FLAGS_images}, gen));
    loader = std::make_unique<fabric::DataLoader>(
        f.setup_dataloader(fabric::device_dataset(cpu, device),
                           fabric::DataLoaderOptions()
                               .batch_size(FLAGS_batch)
                               .shuffle(true)
                               .transform(fabric::crop_flip_normalize(4, kMean, kStd))));
    timed_steps = loader->size();
  }
  std::optional<fabric::DataLoader::Iterator> it;
  int64_t next = 0;
  auto next_batch = [&]() -> std::pair<torch::Tensor, torch::Tensor> {
    if (!loader) return pool[next++ % pool.size()];
    if (!it || *it == loader->end()) it = loader->begin();
    fabric::Batch& b = **it;
    auto out = std::make_pair(b.data, b.target);
    ++*it;
    return out;
  };
  fabric::GraphedStep graphed(f, opt, [&](const std::vector<torch::Tensor>& batch) {
    auto guard = f.autocast();
    return torch::cross_entropy_loss(model->forward(batch[0]), batch[1]);
  });
  auto train_step = [&] {
    auto [x, y] = next_batch();
    if (!FLAGS_data_only) graphed({x, y});  // eager unless --cuda_graphs
  };
  for (int s = 0; s < FLAGS_warmup; ++s) train_step();
  if (loader) it.reset();  // the timed epoch starts at a fresh pass
  const double seconds = timed(device, timed_steps, train_step);
  const double images =
      loader ? static_cast<double>(FLAGS_images) : static_cast<double>(timed_steps) * FLAGS_batch;
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  std::printf(
      "RESULT {\"framework\": \"fabric++\", \"model\": \"%s\", \"batch\": %d, \"precision\": "
      "\"%s\", \"data\": \"%s\", \"channels_last\": %s, \"cuda_graphs\": %s, "
      "\"optimizer_impl\": \"%s\", "
      "\"parameters\": %lld, "
      "\"steps\": %lld, \"seconds\": %.6f, \"images_per_s\": %.3f, \"step_ms\": %.4f, "
      "\"peak_device_mib\": %.1f, \"peak_rss_mib\": %.1f, \"device\": \"%s\"}\n",
      FLAGS_model.c_str(), FLAGS_batch, FLAGS_precision.c_str(), FLAGS_data.c_str(),
      FLAGS_channels_last ? "true" : "false", graphed.graphed() ? "true" : "false",
      FLAGS_optimizer_impl.c_str(), static_cast<long long>(parameters),
      static_cast<long long>(timed_steps), seconds, images / seconds,
      1000.0 * seconds / static_cast<double>(timed_steps), peak_device_mib(device),
      static_cast<double>(usage.ru_maxrss) / 1024.0, device.str().c_str());
  std::fflush(stdout);
  return 0;
}

// The GPT: AdamW with decay on matrices only, random tokens, the next-token loss.
int run_gpt(fabric::Fabric& f) {
  const torch::Device device = f.device();
  fabric::models::GPTConfig config =
      fabric::models::GPTConfig::preset(FLAGS_model == "gpt-tiny" ? "tiny" : FLAGS_model);
  config.fused_loss = FLAGS_fused_loss;
  config.fused_layer_norm = FLAGS_fused_layer_norm;
  if (FLAGS_seq > 0) config.block_size = FLAGS_seq;
  fabric::models::GPT model(config);
  std::vector<torch::Tensor> decay, no_decay;
  for (const auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups{
      {decay, std::make_unique<torch::optim::AdamWOptions>(
                  torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1))},
      {no_decay, std::make_unique<torch::optim::AdamWOptions>(
                     torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.0))}};
  fabric::AdamW opt(groups, torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}),
                    fabric::parse_optimizer_impl(FLAGS_optimizer_impl));
  f.setup(model, opt);
  model->train();
  const int64_t T = config.block_size;
  auto gen = at::detail::createCPUGenerator(0);
  std::vector<torch::Tensor> pool;  // [B, T + 1] token windows
  for (int i = 0; i < 4; ++i)
    pool.push_back(torch::randint(0, config.vocab_size, {FLAGS_batch, T + 1}, gen).to(device));
  int64_t next = 0;
  fabric::GraphedStep graphed(
      f, opt,
      [&](const std::vector<torch::Tensor>& batch) {
        auto guard = f.autocast();
        if (!FLAGS_activation_checkpointing) return model->loss(batch[0], batch[1]);
        return model->loss(batch[0], batch[1],
                           [](fabric::models::Block& b, const torch::Tensor& h) {
                             return fabric::checkpoint_activations(b, h);
                           });
      },
      fabric::GraphedStepOptions().clip_norm(FLAGS_clip));
  const int64_t micro = std::max(1, FLAGS_accumulate);
  auto train_step = [&] {
    for (int64_t m = 0; m < micro; ++m) {
      const torch::Tensor& w = pool[next++ % pool.size()];
      graphed({w.narrow(1, 0, T), w.narrow(1, 1, T)}, fabric::MicroBatch{m, micro});
    }
  };
  for (int s = 0; s < FLAGS_warmup; ++s) train_step();
  const double seconds = timed(device, FLAGS_steps, train_step);
  const double tokens_per_s =
      static_cast<double>(FLAGS_steps) * static_cast<double>(micro) * FLAGS_batch * T / seconds;
  const double tflops = config.flops_per_token() * tokens_per_s / 1e12;
  bool fused = false;
  {
    auto guard = f.autocast();
    fused =
        FLAGS_fused_loss && fabric::models::fused_cross_entropy_applies(torch::zeros({1}, device));
  }
  std::printf(
      "RESULT {\"framework\": \"fabric++\", \"model\": \"%s\", \"batch\": %d, \"seq\": %lld, "
      "\"precision\": \"%s\", \"fp8_recipe\": \"%s\", \"fp8_fast_accumulation\": %s, "
      "\"cuda_graphs\": %s, \"fused_loss\": %s, "
      "\"activation_checkpointing\": %s, \"fused_layer_norm\": %s, \"optimizer_impl\": \"%s\", "
      "\"accumulate\": %lld, \"fp8_weight_cache\": %s, "
      "\"clip\": %g, \"parameters\": %lld, \"steps\": %d, \"seconds\": %.6f, "
      "\"tokens_per_s\": %.1f, \"step_ms\": %.4f, \"tflops\": %.2f, \"mfu\": %.4f, "
      "\"peak_device_mib\": %.1f, \"start_device_mib\": %.1f, \"device\": \"%s\"}\n",
      FLAGS_model.c_str(), FLAGS_batch, static_cast<long long>(T), FLAGS_precision.c_str(),
      FLAGS_fp8_recipe.c_str(), FLAGS_fp8_fast_accumulation ? "true" : "false",
      graphed.graphed() ? "true" : "false", fused ? "true" : "false",
      FLAGS_activation_checkpointing ? "true" : "false", FLAGS_fused_layer_norm ? "true" : "false",
      FLAGS_optimizer_impl.c_str(), static_cast<long long>(micro),
      FLAGS_fp8_weight_cache ? "true" : "false", FLAGS_clip,
      static_cast<long long>(config.parameters()), FLAGS_steps, seconds, tokens_per_s,
      1000.0 * seconds / FLAGS_steps, tflops, tflops / FLAGS_peak_tflops, peak_device_mib(device),
      g_start_device_mib, device.str().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  std::vector<std::string> overrides = {
      "fabric.accelerator=" + FLAGS_accelerator,
      "fabric.devices=1",
      "fabric.strategy=single_device",
      "fabric.precision=" + FLAGS_precision,
      "fabric.fp8.recipe=" + FLAGS_fp8_recipe,
      "fabric.cudnn_benchmark=true",
      std::string("fabric.fp8.fast_accumulation=") +
          (FLAGS_fp8_fast_accumulation ? "true" : "false"),
      "fabric.num_threads=" + std::to_string(FLAGS_threads),
      std::string("fabric.channels_last=") + (FLAGS_channels_last ? "true" : "false"),
      std::string("fabric.cuda_graphs=") + (FLAGS_cuda_graphs ? "true" : "false")};
  // An empty override is an error ("no value given"): the key is set only when the flag is.
  if (!FLAGS_fp8_exclude.empty())
    overrides.push_back("fabric.fp8.exclude_modules=" + FLAGS_fp8_exclude);
  fabric::nn::set_fp8_weight_cache(FLAGS_fp8_weight_cache);
  const auto config = fabric::Config::defaults(fabric::training_schema(), overrides);
  fabric::Fabric fabric(config);
  return fabric.launch([&](fabric::Fabric& f) {
    torch::manual_seed(0);
    if (FLAGS_model.rfind("gpt", 0) == 0) return run_gpt(f);
    if (FLAGS_model == "resnet50") {
      bench::ResNet50 model(10);
      return run(f, model);
    }
    examples::ResNet18Cifar model(64);
    return run(f, model);
  });
}
