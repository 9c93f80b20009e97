// GPU: the CUDA path of synchronized BatchNorm (ATen's batch_norm_stats / gather_stats_with_counts
// / elemt / backward_reduce / backward_elemt) equals the CPU path (ordinary tensor ops) on the
// same data, through a one-rank group (Gloo for the CPU tensors, NCCL for the CUDA ones).
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/utils.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/distributed/process_group.h"
#include "fabric/nn/batch_norm.h"

namespace {

struct Result {
  torch::Tensor y, dx, dw, db, running_mean, running_var;
};

Result run(const torch::Tensor& x0, const torch::Tensor& w0, torch::Device device,
           const c10::intrusive_ptr<c10d::ProcessGroup>& group) {
  // detach(): on the CPU, to() returns x0 itself, and the CUDA run must start from a leaf too.
  auto x = x0.to(device).detach().requires_grad_(true);
  auto weight = torch::linspace(0.5, 1.5, x0.size(1)).to(device).requires_grad_(true);
  auto bias = torch::linspace(-1, 1, x0.size(1)).to(device).requires_grad_(true);
  fabric::nn::detail::SyncBatchNormArgs args;
  args.running_mean = torch::zeros({x0.size(1)}, device);
  args.running_var = torch::ones({x0.size(1)}, device);
  args.group = fabric::nn::detail::make_group(group);
  auto y = fabric::nn::detail::sync_batch_norm(x, weight, bias, args);
  (y * w0.to(device)).sum().backward();
  return {y.cpu(),           x.grad().cpu(),          weight.grad().cpu(),
          bias.grad().cpu(), args.running_mean.cpu(), args.running_var.cpu()};
}

TEST(SyncBatchNormCudaTest, CudaPathEqualsCpuPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  fabric::distributed::StoreOptions store;
  store.is_server = true;
  fabric::distributed::ProcessGroupOptions pg;
  pg.cuda = true;
  auto group = fabric::distributed::make_process_group(fabric::distributed::make_store(store), pg);
  torch::manual_seed(0);
  auto x = torch::randn({8, 4, 5, 5}) * 2 + 0.5;
  auto w = torch::randn({8, 4, 5, 5});
  const Result cpu = run(x, w, torch::kCPU, group);
  const Result gpu = run(x, w, torch::Device(torch::kCUDA, 0), group);
  for (auto [a, b] : {std::pair(cpu.y, gpu.y), std::pair(cpu.dx, gpu.dx), std::pair(cpu.dw, gpu.dw),
                      std::pair(cpu.db, gpu.db), std::pair(cpu.running_mean, gpu.running_mean),
                      std::pair(cpu.running_var, gpu.running_var)}) {
    EXPECT_LT((a - b).abs().max().item<double>(), 1e-4);
  }
}

}  // namespace
