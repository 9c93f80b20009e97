#include "fabric/training/activation_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#ifdef FABRIC_WITH_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <set>
#include <utility>

#include "fabric/core/scope_guard.h"

namespace fabric {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using CudaStates = std::vector<std::pair<c10::DeviceIndex, at::Tensor>>;

// This thread's random and autocast state: what the recomputation must see as the forward did.
struct ThreadState {
  at::Tensor cpu_rng;
  CudaStates cuda_rng;  // the default generator of every CUDA device the inputs are on
  bool autocast_cpu = false, autocast_cuda = false;
  at::ScalarType dtype_cpu = at::kBFloat16, dtype_cuda = at::kHalf;

  static ThreadState capture(const TensorList& inputs) {
    ThreadState s;
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      s.cpu_rng = gen.get_state();
    }
#ifdef FABRIC_WITH_CUDA
    std::set<c10::DeviceIndex> devices;
    for (const auto& t : inputs)
      if (t.defined() && t.is_cuda()) devices.insert(t.device().index());
    for (auto d : devices)
      s.cuda_rng.emplace_back(d, at::cuda::detail::getDefaultCUDAGenerator(d).get_state());
#else
    (void)inputs;
#endif
    s.autocast_cpu = at::autocast::is_autocast_enabled(at::kCPU);
    s.autocast_cuda = at::autocast::is_autocast_enabled(at::kCUDA);
    s.dtype_cpu = at::autocast::get_autocast_dtype(at::kCPU);
    s.dtype_cuda = at::autocast::get_autocast_dtype(at::kCUDA);
    return s;
  }

  void apply() const {
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(cpu_rng);
    }
#ifdef FABRIC_WITH_CUDA
    for (const auto& [d, state] : cuda_rng) {
      auto gen = at::cuda::detail::getDefaultCUDAGenerator(d);
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(state);
    }
#endif
    at::autocast::set_autocast_enabled(at::kCPU, autocast_cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, autocast_cuda);
    at::autocast::set_autocast_dtype(at::kCPU, dtype_cpu);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype_cuda);
  }
};

// What the recomputation needs, kept alive by the autograd node (an IValue capsule).
struct Recompute : torch::CustomClassHolder {
  std::function<TensorList(const TensorList&)> fn;
  torch::nn::Module* module = nullptr;
  ThreadState forward_state;
};

// Copies `module`'s buffers now and writes them back when the guard ends (nullptr: nothing).
ScopeGuard keep_buffers(torch::nn::Module* module) {
  if (module == nullptr) return ScopeGuard();
  at::NoGradGuard no_grad;
  std::vector<std::pair<std::string, at::Tensor>> copies;
  for (const auto& b : module->named_buffers()) copies.emplace_back(b.key(), b.value().clone());
  return ScopeGuard([module, copies = std::move(copies)] {
    at::NoGradGuard no_grad;
    auto live = module->named_buffers();
    for (const auto& [name, value] : copies) live[name].copy_(value);
  });
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
    r->forward_state = ThreadState::capture(inputs);
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
    auto r =
        c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    const size_t num_params = static_cast<size_t>(ctx->saved_data["params"].toInt());
    const size_t num_inputs = saved.size() - num_params;
    TensorList inputs;
    for (size_t i = 0; i < num_inputs; ++i) {
      const auto& x = saved[i];
      inputs.push_back(x.defined() ? x.detach().requires_grad_(x.requires_grad()) : x);
    }
    // Buffers come back when this function returns, after the backward below (BatchNorm's
    // backward reads the running statistics it saved).
    const ScopeGuard buffers_back = keep_buffers(r->module);
    TensorList outputs;
    {
      const ThreadState now = ThreadState::capture(inputs);
      r->forward_state.apply();
      const ScopeGuard state_back([&now] { now.apply(); });
      at::AutoGradMode grad_on(true);
      outputs = r->fn(inputs);
    }
    variable_list roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    variable_list result(1 + saved.size());  // [0]: the Recompute argument
    if (roots.empty()) return result;
    if (num_params == 0) {
      // No parameters named: accumulate into every leaf the function reached (reentrant, as
      // torch.utils.checkpoint), and hand the inputs' gradients out.
      torch::autograd::backward(roots, grads);
      for (size_t i = 0; i < num_inputs; ++i)
        if (inputs[i].defined() && inputs[i].requires_grad()) result[1 + i] = inputs[i].grad();
      return result;
    }
    variable_list wrt;
    std::vector<size_t> slot;
    for (size_t i = 0; i < saved.size(); ++i) {
      const auto& x = i < num_inputs ? inputs[i] : saved[i];
      if (x.defined() && x.requires_grad()) {
        wrt.push_back(x);
        slot.push_back(1 + i);
      }
    }
    if (wrt.empty()) return result;
    const variable_list got = torch::autograd::grad(roots, wrt, grads, /*retain_graph=*/false,
                                                    /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < got.size(); ++k) result[slot[k]] = got[k];
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
