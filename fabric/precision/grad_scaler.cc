#include "fabric/precision/grad_scaler.h"

#include <torch/types.h>

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>

#include <set>
#include <tuple>

#include "fabric/core/error.h"
#include "fabric/core/scaled_step.h"

namespace fabric {

GradScaler::GradScaler(GradScalerOptions options) : options_(options) {
  if (!(options_.init_scale() > 0)) throw Error("GradScaler: init_scale must be > 0");
  if (!(options_.growth_factor() > 1)) throw Error("GradScaler: growth_factor must be > 1");
  if (!(options_.backoff_factor() > 0 && options_.backoff_factor() < 1))
    throw Error("GradScaler: backoff_factor must be in (0, 1)");
  if (options_.growth_interval() < 1) throw Error("GradScaler: growth_interval must be >= 1");
  lazy_init(torch::kCPU);
}

void GradScaler::lazy_init(const torch::Device& device) {
  if (scale_.defined()) {
    if (scale_.device() != device) {
      scale_ = scale_.to(device);
      growth_tracker_ = growth_tracker_.to(device);
      unit_ = unit_.to(device);
    }
    return;
  }
  scale_ = torch::full({1}, options_.init_scale(), torch::dtype(torch::kFloat32).device(device));
  growth_tracker_ = torch::zeros({1}, torch::dtype(torch::kInt32).device(device));
  unit_ = torch::ones({1}, torch::dtype(torch::kFloat32).device(device));
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  if (!options_.enabled()) return loss;
  lazy_init(loss.device());
  // The scale stays float32 and one-dimensional, so a float16 loss is promoted to float32: the
  // initial scale 65536 is above float16's largest value and would turn into inf.
  return loss * scale_;
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) return;
  PerOptimizer& state = per_optimizer_[&optimizer];
  if (state.stage == Stage::kUnscaled)
    throw Error("GradScaler::unscale_: already called for this optimizer since the last update()");
  if (state.stage == Stage::kStepped)
    throw Error("GradScaler::unscale_: called after step(); call update() first");

  const torch::Tensor inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  check_gradients(optimizer, state, inv_scale);
  state.stage = Stage::kUnscaled;
}

void GradScaler::check_gradients(torch::optim::Optimizer& optimizer, PerOptimizer& state,
                                 const torch::Tensor& inv_scale) {
  // Group gradients by (device, dtype): the kernel wants one device and dtype per call.
  std::map<std::tuple<c10::DeviceType, c10::DeviceIndex, c10::ScalarType>,
           std::vector<torch::Tensor>>
      groups;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      const torch::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if (g.scalar_type() == torch::kHalf)
        throw Error(
            "GradScaler: refusing to unscale float16 gradients; keep parameters in float32 "
            "(precision 16-mixed, not 16-true)");
      if (g.is_sparse()) throw Error("GradScaler: sparse gradients are not supported");
      groups[{g.device().type(), g.device().index(), g.scalar_type()}].push_back(g);
    }
  }
  std::map<std::pair<c10::DeviceType, c10::DeviceIndex>, torch::Tensor> found_by_device;
  for (auto& [key, grads] : groups) {
    const torch::Device device(std::get<0>(key), std::get<1>(key));
    torch::Tensor& found = found_by_device[{device.type(), device.index()}];
    if (!found.defined()) found = torch::zeros({1}, torch::dtype(torch::kFloat32).device(device));
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale.to(device));
  }
  state.found_inf.clear();
  for (auto& [device, found] : found_by_device) state.found_inf.push_back(found);
  if (agree_) {  // a rank without gradients still takes part
    if (state.found_inf.empty()) state.found_inf.push_back(torch::zeros({1}, scale_.options()));
    for (auto& found : state.found_inf) agree_(found);
  }
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled()) {
    optimizer.step();
    return true;
  }
  if (per_optimizer_[&optimizer].stage == Stage::kStepped)
    throw Error("GradScaler::step: already called for this optimizer since the last update()");
  if (auto* scaled = dynamic_cast<ScaledStep*>(&optimizer); scaled && scaled->takes_grad_scale()) {
    PerOptimizer& state = per_optimizer_[&optimizer];
    torch::Tensor grad_scale;  // undefined: unscale_() already divided the gradients
    if (state.stage == Stage::kReady) {
      check_gradients(optimizer, state, unit_);  // check only: multiply by 1
      grad_scale = scale_;
    }
    if (state.found_inf.empty()) {  // no gradients at all
      state.found_inf.push_back(torch::zeros({1}, scale_.options()));
    }
    const torch::Tensor found = combine_found_inf(state.found_inf, state.found_inf[0].device());
    scaled->step_scaled(grad_scale, found);
    const torch::Tensor skipped = found.gt(0).to(torch::kLong);
    if (skipped_on_device_.defined()) {
      skipped_on_device_.add_(skipped.to(skipped_on_device_.device()));
    } else {
      skipped_on_device_ = skipped;
    }
    state.stage = Stage::kStepped;
    return true;
  }
  if (per_optimizer_[&optimizer].stage == Stage::kReady) unscale_(optimizer);
  PerOptimizer& state = per_optimizer_[&optimizer];
  // No gradients at all (a step before any backward): nothing to skip, as the fused path does;
  // update() then has its check (it said "call step() first" after this step, and the next step
  // "already called").
  if (state.found_inf.empty()) state.found_inf.push_back(torch::zeros({1}, scale_.options()));
  double found = 0;
  for (const auto& f : state.found_inf) found += f.item<float>();  // one host sync per device
  const bool finite = found == 0;
  if (finite) {
    optimizer.step();
  } else {
    ++skipped_steps_;
  }
  state.stage = Stage::kStepped;
  return finite;
}

torch::Tensor GradScaler::combine_found_inf(const std::vector<torch::Tensor>& flags,
                                            const torch::Device& device) {
  if (flags.empty()) throw Error("GradScaler::combine_found_inf: no flags");
  torch::Tensor combined = flags[0].to(device);
  for (size_t i = 1; i < flags.size(); ++i)
    combined = torch::maximum(combined, flags[i].to(device));
  return combined;
}

void GradScaler::update() {
  if (!options_.enabled()) return;
  std::vector<torch::Tensor> found;
  for (auto& [opt, state] : per_optimizer_)
    for (const auto& f : state.found_inf) found.push_back(f);
  if (found.empty())
    throw Error(
        "GradScaler::update: no inf checks were recorded; call step() (or unscale_()) first");
  const torch::Tensor combined = combine_found_inf(found, scale_.device());
  at::_amp_update_scale_(scale_, growth_tracker_, combined, options_.growth_factor(),
                         options_.backoff_factor(), options_.growth_interval());
  per_optimizer_.clear();
}

int64_t GradScaler::skipped_steps() const {
  return skipped_steps_ + (skipped_on_device_.defined() ? skipped_on_device_.item<int64_t>() : 0);
}

double GradScaler::get_scale() const { return options_.enabled() ? scale_.item<float>() : 1.0; }

int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int32_t>(); }

std::map<std::string, double> GradScaler::state_dict() const {
  return {{"scale", get_scale()},
          {"growth_factor", options_.growth_factor()},
          {"backoff_factor", options_.backoff_factor()},
          {"growth_interval", static_cast<double>(options_.growth_interval())},
          {"growth_tracker", static_cast<double>(growth_tracker())}};
}

void GradScaler::load_state_dict(const std::map<std::string, double>& state) {
  const std::set<std::string> expected = {"scale", "growth_factor", "backoff_factor",
                                          "growth_interval", "growth_tracker"};
  std::string missing, unexpected;
  for (const auto& k : expected)
    if (!state.count(k)) missing += (missing.empty() ? "" : ", ") + k;
  for (const auto& [k, v] : state)
    if (!expected.count(k)) unexpected += (unexpected.empty() ? "" : ", ") + k;
  if (!missing.empty() || !unexpected.empty()) {
    throw Error("GradScaler::load_state_dict: missing keys [" + missing + "], unexpected keys [" +
                unexpected + "]");
  }
  options_.growth_factor(state.at("growth_factor"));
  options_.backoff_factor(state.at("backoff_factor"));
  options_.growth_interval(static_cast<int64_t>(state.at("growth_interval")));
  const torch::Device device = scale_.device();
  scale_ = torch::full({1}, state.at("scale"), torch::dtype(torch::kFloat32).device(device));
  growth_tracker_ = torch::full({1}, static_cast<int32_t>(state.at("growth_tracker")),
                                torch::dtype(torch::kInt32).device(device));
  per_optimizer_.clear();
}

c10::IValue GradScaler::save_state() const {
  c10::impl::GenericDict d = new_state_dict();
  for (const auto& [key, value] : state_dict()) d.insert(key, value);
  return d;
}

std::function<void()> GradScaler::prepare_restore(const c10::IValue& saved,
                                                  const std::string& source) {
  if (!saved.isGenericDict()) throw Error(state_type_error(source, "a GradScaler state", saved));
  std::map<std::string, double> state;
  for (const auto& e : saved.toGenericDict()) {
    if (!e.key().isString() || !(e.value().isDouble() || e.value().isInt()))
      throw Error(source + ": malformed GradScaler state");
    state[e.key().toStringRef()] =
        e.value().isInt() ? static_cast<double>(e.value().toInt()) : e.value().toDouble();
  }
  GradScaler check(options_);  // load_state_dict names missing/unexpected keys
  try {
    check.load_state_dict(state);
  } catch (const Error& e) {
    throw Error(source + ": " + e.what());
  }
  return [this, state] { load_state_dict(state); };
}

}  // namespace fabric
