// fabric::nn::data_parallel(module, input, devices, output_device): one forward pass of `module`
// split over several devices in one process (what fabric.strategy: dp runs through
// Fabric::forward). The batch is cut along dimension 0 into one chunk per device (fewer when the
// batch is smaller), each chunk runs on a replica of the module on its device in its own thread,
// and the outputs are concatenated on `output_device`. Backward reaches the module's own
// parameters: each replica's parameter gradients are summed into them (LibTorch's replicate()).
//
// Three things differ from torch::nn::parallel::data_parallel, which this replaces:
//  - Each replica thread runs with the caller's thread-local state (autocast on/off and dtype,
//    grad mode, inference mode), so `16-mixed`/`bf16-mixed` reach the replicas.
//  - Buffers the forward pass updates (BatchNorm's running statistics) reach the module: in
//    training mode, each floating-point buffer becomes the mean of the replicas' values and every
//    other buffer (num_batches_tracked) takes the first replica's. LibTorch's replicas are deep
//    copies whose updates were dropped, so the module's running statistics never moved.
//  - No CUDA-only Scatter/Gather: chunks and outputs move with Tensor::to, so it also runs with
//    CPU devices (how tests check it on machines without GPUs).
// REQUIRES: `module` is a ModuleHolder of a torch::nn::Cloneable (replicas are clone()s) and its
// parameters live on devices.front(); the input's first dimension is the batch.
#ifndef FABRIC_NN_DATA_PARALLEL_H_
#define FABRIC_NN_DATA_PARALLEL_H_

#include <ATen/ThreadLocalState.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <torch/nn/parallel/data_parallel.h>

#include <exception>
#include <thread>
#include <vector>

namespace fabric::nn {

template <typename Holder>
torch::Tensor data_parallel(Holder& module, const torch::Tensor& input,
                            const std::vector<torch::Device>& devices,
                            const torch::Device& output_device) {
  if (devices.size() <= 1) return module->forward(input.to(devices.front())).to(output_device);
  const std::vector<torch::Tensor> chunks = input.chunk(static_cast<int64_t>(devices.size()), 0);
  const std::vector<torch::Device> used(devices.begin(), devices.begin() + chunks.size());
  auto replicas = torch::nn::parallel::replicate(module, used);

  std::vector<torch::Tensor> outputs(used.size());
  std::vector<std::exception_ptr> errors(used.size());
  const at::ThreadLocalState caller;  // autocast, grad mode, ... of the calling thread
  auto run = [&](size_t i) {
    try {
      at::ThreadLocalStateGuard state(caller);
      c10::OptionalDeviceGuard device(used[i].is_cpu() ? std::nullopt
                                                       : std::optional<c10::Device>(used[i]));
      outputs[i] = replicas[i]->forward(chunks[i].to(used[i])).to(output_device);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < used.size(); ++i) threads.emplace_back(run, i);
  run(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);

  if (module->is_training()) {
    at::NoGradGuard no_grad;
    auto own = module->named_buffers(/*recurse=*/true);
    std::vector<decltype(own)> theirs;
    for (auto& r : replicas) theirs.push_back(r->named_buffers(/*recurse=*/true));
    for (auto& item : own) {
      torch::Tensor& buffer = item.value();
      if (!buffer.defined()) continue;
      if (buffer.is_floating_point()) {
        torch::Tensor sum = at::zeros_like(buffer);
        for (auto& t : theirs) sum.add_(t[item.key()].to(buffer.device()));
        buffer.copy_(sum.div_(static_cast<double>(theirs.size())));
      } else {
        buffer.copy_(theirs.front()[item.key()]);
      }
    }
  }
  return at::cat(outputs, 0);
}

}  // namespace fabric::nn

#endif  // FABRIC_NN_DATA_PARALLEL_H_
