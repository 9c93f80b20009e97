#include "fabric/training/fast_optimizers.h"

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_maximum.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <cmath>
#include <map>
#include <optional>
#include <tuple>

#include "fabric/core/error.h"

namespace fabric {
namespace {

using TensorList = std::vector<torch::Tensor>;

// ATen's fused optimizer kernels write the parameters without bumping their version counters
// (an in-place op would): bumped here, so that what keys on a parameter's version (autograd's
// saved-tensor check, fabric/nn/fp8.h's kept float8 weight casts) sees the step.
void bump_versions(const TensorList& params) {
  for (const auto& p : params)
    if (!p.is_inference()) p.unsafeGetTensorImpl()->bump_version();
}
using GroupKey = std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType>;

GroupKey key_of(const torch::Tensor& t) {
  return {t.device().type(), t.device().index(), t.scalar_type()};
}

void check_gradient(const torch::Tensor& grad, OptimizerImpl impl) {
  if (grad.is_sparse() || grad.is_complex())
    throw Error("fabric optimizer (" + optimizer_impl_name(impl) +
                "): sparse or complex gradients are not supported; use implementation "
                "for_loop (optimizer.implementation: for_loop)");
}

std::optional<at::Tensor> on(const at::Tensor& t, const torch::Device& device) {
  if (!t.defined()) return std::nullopt;
  return t.device() == device ? t : t.to(device);
}

// The loss of `closure` (if any, with gradients enabled, as torch::optim's steps do), then
// `update` of all parameters.
template <typename Closure, typename Update>
torch::Tensor closure_then_update(const Closure& closure, const Update& update) {
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  update();
  return loss;
}

OptimizerImpl resolved(OptimizerImpl impl) {
  return impl == OptimizerImpl::kAuto ? OptimizerImpl::kFused : impl;
}

}  // namespace

OptimizerImpl parse_optimizer_impl(const std::string& name) {
  if (name == "auto") return OptimizerImpl::kAuto;
  if (name == "fused") return OptimizerImpl::kFused;
  if (name == "foreach") return OptimizerImpl::kForeach;
  if (name == "for_loop") return OptimizerImpl::kForLoop;
  throw Error("unknown optimizer implementation \"" + name +
              "\" (expected auto, fused, foreach or for_loop)");
}

std::string optimizer_impl_name(OptimizerImpl impl) {
  switch (impl) {
    case OptimizerImpl::kAuto:
      return "auto";
    case OptimizerImpl::kFused:
      return "fused";
    case OptimizerImpl::kForeach:
      return "foreach";
    case OptimizerImpl::kForLoop:
      return "for_loop";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// SGD

SGD::SGD(const std::vector<torch::Tensor>& params, const torch::optim::SGDOptions& options,
         OptimizerImpl impl)
    : torch::optim::SGD(params, options), impl_(resolved(impl)) {}

SGD::SGD(const std::vector<torch::optim::OptimizerParamGroup>& groups,
         const torch::optim::SGDOptions& options, OptimizerImpl impl)
    : torch::optim::SGD(groups, options), impl_(resolved(impl)) {}

torch::Tensor SGD::step(LossClosure closure) {
  if (impl_ == OptimizerImpl::kForLoop) return torch::optim::SGD::step(std::move(closure));
  return closure_then_update(closure, [this] { update({}, {}); });
}

void SGD::step_scaled(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (!takes_grad_scale()) throw Error("fabric::SGD::step_scaled needs the fused implementation");
  update(grad_scale, found_inf);
}

void SGD::update(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  for (size_t group_index = 0; group_index < param_groups().size(); ++group_index) {
    auto& group = param_groups()[group_index];
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    const double momentum = o.momentum();
    // Per (device, dtype), and whether the momentum buffer exists yet (first step copies the
    // gradient into it).
    std::map<std::pair<GroupKey, bool>, std::array<TensorList, 3>> batches;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      check_gradient(p.grad(), impl_);
      bool first = false;
      torch::Tensor buffer;
      if (momentum != 0) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) {
          first = true;
          // Zeros, not empty: a first step skipped for inf/NaN leaves a valid (zero) buffer.
          buffer = torch::zeros_like(p, at::MemoryFormat::Preserve);
          auto s = std::make_unique<torch::optim::SGDParamState>();
          s->momentum_buffer(buffer);
          state_[p.unsafeGetTensorImpl()] = std::move(s);
        } else {
          buffer = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
        }
      }
      auto& b = batches[{key_of(p), first}];
      b[0].push_back(p);
      b[1].push_back(p.grad());
      if (buffer.defined()) b[2].push_back(buffer);
    }
    for (auto& [key, b] : batches) {
      auto& [params, grads, buffers] = b;
      const bool first = key.second;
      if (impl_ == OptimizerImpl::kFused) {
        const torch::Device device = params[0].device();
        if (device_lr_.on) {
          at::_fused_sgd_(params, grads, buffers, o.weight_decay(), momentum,
                          device_lr_.get(group_index, device, o.lr()), o.dampening(), o.nesterov(),
                          /*maximize=*/false, first, on(grad_scale, device), on(found_inf, device));
        } else {
          at::_fused_sgd_(params, grads, buffers, o.weight_decay(), momentum, o.lr(), o.dampening(),
                          o.nesterov(), /*maximize=*/false, first, on(grad_scale, device),
                          on(found_inf, device));
        }
        bump_versions(params);
        continue;
      }
      TensorList d = grads;
      if (o.weight_decay() != 0) d = at::_foreach_add(grads, params, o.weight_decay());
      if (momentum != 0) {
        if (first) {
          for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(d[i]);
        } else {
          at::_foreach_mul_(buffers, momentum);
          at::_foreach_add_(buffers, d, 1 - o.dampening());
        }
        if (o.nesterov()) {
          d = at::_foreach_add(d, buffers, momentum);
        } else {
          d = buffers;
        }
      }
      at::_foreach_add_(params, d, -o.lr());
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Adam / AdamW

namespace internal {

const at::Tensor& DeviceLr::get(size_t group, const torch::Device& device, double lr) {
  at::Tensor& t = tensors_[{group, device.str()}];
  if (!t.defined()) t = torch::full({}, lr, torch::dtype(torch::kFloat32).device(device));
  return t;
}

void DeviceLr::refresh(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (auto& [key, t] : tensors_) t.fill_(groups.at(key.first).options().get_lr());
}

template <typename B, typename O, typename S>
AdamFamily<B, O, S>::AdamFamily(const std::vector<torch::Tensor>& params, const O& options,
                                OptimizerImpl impl)
    : B(params, options), impl_(resolved(impl)) {}

template <typename B, typename O, typename S>
AdamFamily<B, O, S>::AdamFamily(const std::vector<torch::optim::OptimizerParamGroup>& groups,
                                const O& options, OptimizerImpl impl)
    : B(groups, options), impl_(resolved(impl)) {}

template <typename B, typename O, typename S>
torch::Tensor AdamFamily<B, O, S>::step(LossClosure closure) {
  if (impl_ == OptimizerImpl::kForLoop) return B::step(std::move(closure));
  return closure_then_update(closure, [this] { update({}, {}); });
}

template <typename B, typename O, typename S>
void AdamFamily<B, O, S>::step_scaled(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  if (!takes_grad_scale())
    throw Error("fabric::Adam(W)::step_scaled needs the fused implementation");
  update(grad_scale, found_inf);
}

template <typename B, typename O, typename S>
void AdamFamily<B, O, S>::update(const at::Tensor& grad_scale, const at::Tensor& found_inf) {
  constexpr bool kDecoupled = std::is_same_v<S, torch::optim::AdamWParamState>;
  at::NoGradGuard no_grad;
  for (size_t group_index = 0; group_index < this->param_groups().size(); ++group_index) {
    auto& group = this->param_groups()[group_index];
    const auto& o = static_cast<const O&>(group.options());
    const auto [beta1, beta2] = o.betas();
    // Per (device, dtype) and, for kForeach, per step count (bias corrections differ).
    struct Batch {
      TensorList params, grads, exp_avgs, exp_avg_sqs, max_sqs, steps;
    };
    std::map<std::pair<GroupKey, int64_t>, Batch> batches;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      check_gradient(p.grad(), impl_);
      auto it = this->state_.find(p.unsafeGetTensorImpl());
      if (it == this->state_.end()) {
        auto s = std::make_unique<S>();
        s->step(0);
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        it = this->state_.emplace(p.unsafeGetTensorImpl(), std::move(s)).first;
      }
      auto& s = static_cast<S&>(*it->second);
      s.step(s.step() + 1);  // exact unless a device-decided skip happens (host_stale_)
      const bool fused = impl_ == OptimizerImpl::kFused;
      auto& b = batches[{key_of(p), fused ? 0 : s.step()}];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avgs.push_back(s.exp_avg());
      b.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) b.max_sqs.push_back(s.max_exp_avg_sq());
      if (fused) {
        at::Tensor& d = device_steps_[p.unsafeGetTensorImpl()];
        if (!d.defined()) {
          d = torch::full({}, static_cast<double>(s.step() - 1),
                          torch::dtype(torch::kFloat32).device(p.device()));
        }
        b.steps.push_back(d);
      }
    }
    for (auto& [key, b] : batches) {
      if (impl_ == OptimizerImpl::kFused) {
        const torch::Device device = b.params[0].device();
        const auto scale = on(grad_scale, device);
        const auto found = on(found_inf, device);
        at::_foreach_add_(b.steps, 1);
        // The same kernel either way; with device_lr the learning rate is read on the device.
        auto fused = [&](const auto& lr) {
          if constexpr (kDecoupled) {
            at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_sqs, b.steps, lr,
                              beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                              /*maximize=*/false, scale, found);
          } else {
            at::_fused_adam_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_sqs, b.steps, lr,
                             beta1, beta2, o.weight_decay(), o.eps(), o.amsgrad(),
                             /*maximize=*/false, scale, found);
          }
        };
        if (device_lr_.on) {
          fused(device_lr_.get(group_index, device, o.lr()));
        } else {
          fused(o.lr());
        }
        bump_versions(b.params);
        if (found) {
          // A skipped step does not count; the host counts are stale until sync_state().
          at::_foreach_sub_(b.steps, TensorList(b.steps.size(), found->reshape({})));
          host_stale_ = true;
        }
        continue;
      }
      const int64_t step = key.second;
      const double bias1 = 1 - std::pow(beta1, step);
      const double bias2 = 1 - std::pow(beta2, step);
      TensorList grads = b.grads;
      if (o.weight_decay() != 0) {
        if constexpr (kDecoupled) {
          at::_foreach_mul_(b.params, 1 - o.lr() * o.weight_decay());
        } else {
          grads = at::_foreach_add(grads, b.params, o.weight_decay());
        }
      }
      at::_foreach_mul_(b.exp_avgs, beta1);
      at::_foreach_add_(b.exp_avgs, grads, 1 - beta1);
      at::_foreach_mul_(b.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(b.exp_avg_sqs, grads, grads, 1 - beta2);
      TensorList* second = &b.exp_avg_sqs;
      if (o.amsgrad()) {
        at::_foreach_maximum_(b.max_sqs, b.exp_avg_sqs);
        second = &b.max_sqs;
      }
      TensorList denom = at::_foreach_sqrt(*second);
      at::_foreach_div_(denom, std::sqrt(bias2));
      at::_foreach_add_(denom, o.eps());
      at::_foreach_addcdiv_(b.params, b.exp_avgs, denom, -o.lr() / bias1);
    }
  }
}

template <typename B, typename O, typename S>
void AdamFamily<B, O, S>::sync_state() {
  if (!host_stale_) return;
  // One copy to the host per device.
  std::map<std::pair<c10::DeviceType, c10::DeviceIndex>, std::pair<std::vector<S*>, TensorList>>
      by_device;
  for (auto& [impl, state] : this->state_) {
    auto it = device_steps_.find(impl);
    if (it == device_steps_.end()) continue;
    auto& entry = by_device[{it->second.device().type(), it->second.device().index()}];
    entry.first.push_back(static_cast<S*>(state.get()));
    entry.second.push_back(it->second);
  }
  for (auto& [device, entry] : by_device) {
    const torch::Tensor steps = torch::stack(entry.second).to(torch::kCPU, torch::kFloat64);
    const double* values = steps.data_ptr<double>();
    for (size_t i = 0; i < entry.first.size(); ++i)
      entry.first[i]->step(static_cast<int64_t>(std::llround(values[i])));
  }
  host_stale_ = false;
}

template <typename B, typename O, typename S>
void AdamFamily<B, O, S>::state_loaded() {
  device_steps_.clear();
  host_stale_ = false;
}

template <typename B, typename O, typename S>
void AdamFamily<B, O, S>::save(torch::serialize::OutputArchive& archive) const {
  const_cast<AdamFamily*>(this)->sync_state();  // the state's values, not its representation
  B::save(archive);
}

template <typename B, typename O, typename S>
void AdamFamily<B, O, S>::load(torch::serialize::InputArchive& archive) {
  B::load(archive);
  state_loaded();
}

template class AdamFamily<torch::optim::Adam, torch::optim::AdamOptions,
                          torch::optim::AdamParamState>;
template class AdamFamily<torch::optim::AdamW, torch::optim::AdamWOptions,
                          torch::optim::AdamWParamState>;

}  // namespace internal
}  // namespace fabric
