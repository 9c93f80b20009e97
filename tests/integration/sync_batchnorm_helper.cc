// Test helper for sync_batchnorm_test: a self-launched DDP job (fabric.sync_batchnorm) whose model
// is a torch::nn::BatchNorm inside a Sequential (so convert_sync_batchnorm must swap it), fed
// batches of unequal (possibly empty) size per rank. Every rank compares, after each of STEPS
// SGD steps, with torch::nn::BatchNorm on the concatenated batch in one process:
//   outputs, input gradients, weight/bias gradients after DDP averaging, running statistics,
//   num_batches_tracked and the updated parameters.
//   sync_batchnorm_helper KIND SIZES...     KIND: 1d | 2d | 3d, or 2d_cl (channels-last input),
//                                           2d_bf16 (bfloat16 input, float parameters: what
//                                           bf16-mixed feeds it); SIZES: per-rank batch sizes
// Prints "max_abs_diff=X" and exits 0 when X <= 1e-5 (bf16 input: 3e-2, its rounding) and every
// check passed.
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <cstdio>
#include <string>

#include "fabric/environments/environments.h"
#include "fabric/nn/batch_norm.h"
#include "strategies/ddp.h"

namespace {

constexpr int64_t kChannels = 3;
constexpr int64_t kSteps = 3;

torch::nn::AnyModule make_bn(const std::string& kind) {
  auto options = torch::nn::BatchNormOptions(kChannels).momentum(0.3);
  if (kind == "1d") return torch::nn::AnyModule(torch::nn::BatchNorm1d(options));
  if (kind == "3d") return torch::nn::AnyModule(torch::nn::BatchNorm3d(options));
  return torch::nn::AnyModule(torch::nn::BatchNorm2d(options));
}

std::vector<int64_t> example_shape(const std::string& kind) {
  if (kind == "1d") return {kChannels, 5};
  if (kind == "3d") return {kChannels, 2, 3, 2};
  return {kChannels, 4, 3};
}

// Step s's global batch (input and the loss weights), identical on every rank.
std::pair<torch::Tensor, torch::Tensor> global_batch(const std::string& kind, int64_t total,
                                                     int64_t step) {
  torch::manual_seed(100 + step);
  std::vector<int64_t> shape = {total};
  for (int64_t d : example_shape(kind)) shape.push_back(d);
  auto x = torch::randn(shape) * 3 + 1.5;
  return {x, torch::randn(shape)};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.numel() == 0 && b.numel() == 0) return 0;
  return (a - b).abs().max().item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) return 2;
  const std::string variant = argv[1];
  const std::string kind = variant.substr(0, 2);
  const bool bf16 = variant == "2d_bf16", channels_last = variant == "2d_cl";
  // Not bitwise: the reference reduces the whole batch's statistics in one sum, the ranks reduce
  // their own and then combine counts, means and variances (Welford's merge); float32 rounds
  // those two orders apart by a few ulps (2^-23 = 1.2e-7) in each of the statistics, the output,
  // and the three gradient reductions, so 1e-5 (~80 ulps) bounds one forward/backward. bf16
  // keeps 8 significant bits (2^-8 = 3.9e-3 per value): 3e-2 is ~8 such roundings.
  const double tolerance = bf16 ? 3e-2 : 1e-5;
  std::vector<int64_t> sizes;
  for (int i = 2; i < argc; ++i) sizes.push_back(std::atoll(argv[i]));
  const auto world = static_cast<int64_t>(sizes.size());
  int64_t total = 0;
  for (int64_t n : sizes) total += n;

  auto env = std::shared_ptr<fabric::ClusterEnvironment>(
      fabric::detect_environment(fabric::process_environment(), world));
  fabric::strategies::DdpOptions options;
  options.timeout = std::chrono::seconds(30);
  options.sync_batchnorm = true;
  fabric::strategies::Ddp ddp(
      env, torch::kCPU,
      std::make_unique<fabric::Precision>(fabric::PrecisionMode::k32True, c10::DeviceType::CPU),
      options, std::vector<std::string>(argv, argv + argc));
  ddp.setup_environment();
  const int64_t rank = ddp.global_rank();
  int64_t offset = 0;
  for (int64_t r = 0; r < rank; ++r) offset += sizes[static_cast<size_t>(r)];
  const int64_t local = sizes[static_cast<size_t>(rank)];

  torch::nn::Sequential model;
  model->push_back(make_bn(kind));
  torch::nn::Sequential reference;
  reference->push_back(make_bn(kind));
  const auto before = model->named_parameters()["0.weight"];
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD ref_opt(reference->parameters(), torch::optim::SGDOptions(0.1));
  ddp.setup_module(*model);
  int failures = 0;
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "rank %lld: %s\n", static_cast<long long>(rank), what.c_str());
    ++failures;
  };
  if (ddp.sync_batchnorm_modules() != 1) fail("expected 1 synchronized BatchNorm");
  if (!model->ptr(0)->as<fabric::nn::BatchNorm1dImpl>() &&
      !model->ptr(0)->as<fabric::nn::BatchNorm2dImpl>() &&
      !model->ptr(0)->as<fabric::nn::BatchNorm3dImpl>())
    fail("the torch BatchNorm was not swapped for a fabric one");
  if (!model->named_parameters()["0.weight"].is_same(before))
    fail("the swapped module does not keep the optimizer's parameter tensor");

  double worst = 0;
  for (int64_t step = 0; step < kSteps; ++step) {
    auto [x, w] = global_batch(kind, total, step);
    if (bf16) x = x.to(torch::kBFloat16).to(torch::kFloat);  // the reference sees the same values
    // Reference: BatchNorm on the concatenated batch, loss = sum(y * w) / total.
    auto ref_x = x.clone().requires_grad_(true);
    ref_opt.zero_grad();
    auto ref_y = reference->forward(ref_x);
    (ref_y * w).sum().div(total).backward();
    ref_opt.step();

    // This rank's slice; loss scaled by world / total so DDP's averaging gives the reference.
    auto my_x = x.narrow(0, offset, local).clone();
    if (bf16) my_x = my_x.to(torch::kBFloat16);
    if (channels_last) my_x = my_x.contiguous(at::MemoryFormat::ChannelsLast);
    my_x.requires_grad_(true);
    opt.zero_grad();
    auto my_y = model->forward(my_x);
    ddp.backward((my_y * w.narrow(0, offset, local)).sum() * (static_cast<double>(world) / total));
    // Input gradients are those of the global loss scaled by world (the DDP loss convention).
    const double d_out =
        max_diff(my_y.detach().to(torch::kFloat), ref_y.detach().narrow(0, offset, local));
    const double d_grad = max_diff(my_x.grad().to(torch::kFloat) / static_cast<double>(world),
                                   ref_x.grad().narrow(0, offset, local));
    const auto mine = model->named_parameters();
    const auto theirs = reference->named_parameters();
    const double d_wgrad = max_diff(mine["0.weight"].grad(), theirs["0.weight"].grad());
    const double d_bgrad = max_diff(mine["0.bias"].grad(), theirs["0.bias"].grad());
    ddp.optimizer_step(opt);
    double d_state = 0;
    for (const auto& b : reference->named_buffers())
      d_state = std::max(d_state, max_diff(model->named_buffers()[b.key()].to(torch::kDouble),
                                           b.value().to(torch::kDouble)));
    for (const auto& p : reference->named_parameters())
      d_state = std::max(d_state, max_diff(mine[p.key()].detach(), p.value().detach()));
    std::printf(
        "rank %lld step %lld: output %.2g input_grad %.2g weight_grad %.2g bias_grad %.2g "
        "state %.2g\n",
        static_cast<long long>(rank), static_cast<long long>(step), d_out, d_grad, d_wgrad, d_bgrad,
        d_state);
    worst = std::max({worst, d_out, d_grad, d_wgrad, d_bgrad, d_state});
  }
  std::printf("max_abs_diff=%g\n", worst);
  if (!(worst <= tolerance)) fail("difference above " + std::to_string(tolerance));
  ddp.teardown();
  return failures == 0 ? 0 : 1;
}
