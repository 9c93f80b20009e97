#include "fabric/checkpoint/rng_state.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <torch/cuda.h>

#include <mutex>
#include <string>

#include "fabric/core/error.h"

namespace fabric {
namespace {

at::Generator generator(const c10::Device& device) {
  return device.is_cpu() ? at::detail::getDefaultCPUGenerator()
                         : at::globalContext().defaultGenerator(device);
}

torch::Tensor state_of(const c10::Device& device) {
  at::Generator gen = generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void restore(const c10::Device& device, const torch::Tensor& state) {
  at::Generator gen = generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  const int64_t expected = gen.get_state().numel();
  if (state.scalar_type() != torch::kByte || state.numel() != expected)
    throw Error("random generator state of " + device.str() + " has " +
                std::to_string(state.numel()) + " bytes, this LibTorch's has " +
                std::to_string(expected));
  gen.set_state(state.contiguous());
}

}  // namespace

RngState get_rng_state() {
  RngState s;
  s.cpu = state_of(c10::Device(c10::kCPU));
  const auto n = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < n; ++i) s.cuda.push_back(state_of(c10::Device(c10::kCUDA, i)));
  return s;
}

void set_rng_state(const RngState& state) {
  restore(c10::Device(c10::kCPU), state.cpu);
  const auto n = static_cast<int64_t>(torch::cuda::device_count());
  for (int64_t i = 0; i < n && i < static_cast<int64_t>(state.cuda.size()); ++i)
    restore(c10::Device(c10::kCUDA, i), state.cuda[i]);
}

}  // namespace fabric
