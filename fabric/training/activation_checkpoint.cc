#include "fabric/training/activation_checkpoint.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#ifdef FABRIC_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <set>
#include <utility>

#include "fabric/core/error.h"

namespace fabric {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the recomputation needs, kept alive by the autograd node (an IValue capsule).
struct Recompute : torch::CustomClassHolder {
  std::function<TensorList(const TensorList&)> fn;
  torch::nn::Module* module = nullptr;
  at::Tensor cpu_rng;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_rng;
  bool autocast_cpu = false, autocast_cuda = false;
  at::ScalarType dtype_cpu = at::kBFloat16, dtype_cuda = at::kHalf;
};

std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_states(const TensorList& inputs) {
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> states;
#ifdef FABRIC_WITH_CUDA
  std::set<c10::DeviceIndex> devices;
  for (const auto& t : inputs)
    if (t.defined() && t.is_cuda()) devices.insert(t.device().index());
  for (auto d : devices) states.emplace_back(d, at::cuda::detail::getDefaultCUDAGenerator(d).get_state());
#else
  (void)inputs;
#endif
  return states;
}

void set_cuda_states(const std::vector<std::pair<c10::DeviceIndex, at::Tensor>>& states) {
#ifdef FABRIC_WITH_CUDA
  for (const auto& [d, state] : states) {
    auto gen = at::cuda::detail::getDefaultCUDAGenerator(d);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
#else
  (void)states;
#endif
}

at::Tensor cpu_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_state(const at::Tensor& state) {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // `params`: the module's parameters. They are inputs of this node, so the outputs require
  // gradients when they do, and their gradients (taken from the recomputed graph with
  // autograd::grad, not accumulated there) flow out of this node like any input's: each is
  // accumulated once, by the outer backward, where DDP's Reducer hooks expect it.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<Recompute> r,
                               at::TensorList input_list, at::TensorList params) {
    const TensorList inputs = input_list.vec();
    ctx->saved_data["params"] = static_cast<int64_t>(params.size());
    r->cpu_rng = cpu_state();
    r->cuda_rng = cuda_states(inputs);
    r->autocast_cpu = at::autocast::is_autocast_enabled(at::kCPU);
    r->autocast_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    r->dtype_cpu = at::autocast::get_autocast_dtype(at::kCPU);
    r->dtype_cuda = at::autocast::get_autocast_dtype(at::kCUDA);
    TensorList saved = inputs;
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    TensorList outputs;
    {
      at::NoGradGuard no_grad;
      outputs = r->fn(inputs);
    }
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(r));
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto r = c10::static_intrusive_pointer_cast<Recompute>(
        ctx->saved_data["recompute"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t num_params = static_cast<size_t>(ctx->saved_data["params"].toInt());
    const size_t num_inputs = saved.size() - num_params;
    TensorList inputs;
    for (size_t i = 0; i < num_inputs; ++i) {
      const auto& x = saved[i];
      inputs.push_back(x.defined() ? x.detach().requires_grad_(x.requires_grad()) : x);
    }
    // The forward's random state and autocast state, this thread's put back afterwards.
    const at::Tensor cpu_now = cpu_state();
    const auto cuda_now = cuda_states(inputs);
    const bool ac_cpu = at::autocast::is_autocast_enabled(at::kCPU);
    const bool ac_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    const auto dt_cpu = at::autocast::get_autocast_dtype(at::kCPU);
    const auto dt_cuda = at::autocast::get_autocast_dtype(at::kCUDA);
    std::vector<std::pair<std::string, at::Tensor>> buffers;
    if (r->module != nullptr) {
      at::NoGradGuard no_grad;
      for (const auto& b : r->module->named_buffers()) buffers.emplace_back(b.key(), b.value().clone());
    }
    set_cpu_state(r->cpu_rng);
    set_cuda_states(r->cuda_rng);
    at::autocast::set_autocast_enabled(at::kCPU, r->autocast_cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, r->autocast_cuda);
    at::autocast::set_autocast_dtype(at::kCPU, r->dtype_cpu);
    at::autocast::set_autocast_dtype(at::kCUDA, r->dtype_cuda);
    auto restore = [&] {
      set_cpu_state(cpu_now);
      set_cuda_states(cuda_now);
      at::autocast::set_autocast_enabled(at::kCPU, ac_cpu);
      at::autocast::set_autocast_enabled(at::kCUDA, ac_cuda);
      at::autocast::set_autocast_dtype(at::kCPU, dt_cpu);
      at::autocast::set_autocast_dtype(at::kCUDA, dt_cuda);
    };
    // After the backward below (BatchNorm's backward reads the running statistics it saved).
    auto restore_buffers = [&] {
      if (r->module == nullptr) return;
      at::NoGradGuard no_grad;
      auto live = r->module->named_buffers();
      for (const auto& [name, value] : buffers) live[name].copy_(value);
    };
    TensorList outputs;
    try {
      at::AutoGradMode grad_on(true);
      outputs = r->fn(inputs);
    } catch (...) {
      restore();
      restore_buffers();
      throw;
    }
    restore();
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    variable_list result(1 + saved.size());  // [0]: the Recompute argument
    if (num_params == 0) {
      // No parameters named: accumulate into every leaf the function reached (reentrant, as
      // torch.utils.checkpoint), and hand the inputs' gradients out.
      try {
        if (!roots.empty()) torch::autograd::backward(roots, grads);
      } catch (...) {
        restore_buffers();
        throw;
      }
      for (size_t i = 0; i < num_inputs; ++i)
        if (inputs[i].defined() && inputs[i].requires_grad()) result[1 + i] = inputs[i].grad();
    } else {
      variable_list wrt;
      std::vector<size_t> slot;
      for (size_t i = 0; i < saved.size(); ++i) {
        const auto& x = i < num_inputs ? inputs[i] : saved[i];
        if (x.defined() && x.requires_grad()) {
          wrt.push_back(x);
          slot.push_back(1 + i);
        }
      }
      variable_list got;
      try {
        if (!roots.empty() && !wrt.empty())
          got = torch::autograd::grad(roots, wrt, grads, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      } catch (...) {
        restore_buffers();
        throw;
      }
      for (size_t k = 0; k < got.size(); ++k) result[slot[k]] = got[k];
    }
    restore_buffers();
    return result;
  }
};

}  // namespace

TensorList checkpoint(std::function<TensorList(const TensorList&)> fn, const TensorList& inputs,
                      torch::nn::Module* module) {
  if (!c10::GradMode::is_enabled()) return fn(inputs);
  auto r = c10::make_intrusive<Recompute>();
  r->fn = std::move(fn);
  r->module = module;
  const TensorList params = module != nullptr ? module->parameters() : TensorList();
  return CheckpointFunction::apply(std::move(r), at::TensorList(inputs), at::TensorList(params));
}

}  // namespace fabric
