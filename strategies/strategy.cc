#include "strategies/strategy.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/nn/empty_init.h"
#include "fabric/training/clip.h"

namespace fabric {

void Strategy::convert_module(torch::nn::Module& module) {
  precision_->convert_module(module);
  if (precision_->mode() != PrecisionMode::kFp8Mixed) return;
  fp8_conversion_ = fabric::nn::convert_to_fp8(
      module, precision_->fp8_exclude(),
      precision_->fp8_rowwise()            ? fabric::nn::Fp8Scaling::kRowwise
      : precision_->fp8_amax_history() > 0 ? fabric::nn::Fp8Scaling::kDelayed
                                           : fabric::nn::Fp8Scaling::kTensorwise,
      precision_->fp8_amax_history(),  // read under kDelayed only
      precision_->fp8_fast_accumulation(), precision_->fp8_grad_margin());
  const auto& c = fp8_conversion_;
  if (!c.unmatched.empty()) {
    // A typo would keep nothing out of float8 in silence. A config error (exit 2, never
    // restarted), as optimizer.no_weight_decay's pattern that matches nothing.
    const auto& names = !c.converted.empty() ? c.converted : c.excluded;
    throw ConfigError(
        "fabric.fp8.exclude_modules: '" + c.unmatched[0] +
        "' matches no fabric::nn::Linear of the model" +
        (names.empty() ? std::string() : "; Linear names look like '" + names.back() + "'") +
        " ('*' matches one name component; a pattern names the Linear itself)");
  }
  const auto& exclude = precision_->fp8_exclude();
  const bool by_size =
      std::find(exclude.begin(), exclude.end(), "auto_filter_small_kn") != exclude.end();
  if (c.converted.empty())
    throw Error("fabric.precision: fp8-mixed: the module has no Linear layer to run in float8 (" +
                std::to_string(c.plain.size()) + " torch::nn::Linear, " +
                std::to_string(c.excluded.size()) + " excluded by fabric.fp8.exclude_modules" +
                (by_size ? " (auto_filter_small_kn: by size, too small to gain)" : "") + ", " +
                std::to_string(c.unfit.size()) +
                " with features not a multiple of 16); build the layers as fabric::nn::Linear "
                "(same options and parameters), or use bf16-mixed");
}

std::shared_ptr<InitRecord> Strategy::take_empty_init(const torch::nn::Module& module) {
  std::shared_ptr<InitRecord> record = std::move(empty_init_);
  empty_init_.reset();
  if (!has_meta_tensors(module)) return nullptr;
  if (!record)
    throw Error(
        "setup: the module has parameters or buffers on the meta device that no empty init "
        "recorded; build it with Fabric::init_module (or give those tensors a device)");
  return record;
}

void Strategy::materialize_empty_init(torch::nn::Module& module, torch::Device device) {
  if (auto record = take_empty_init(module)) materialize(module, *record, device);
}

c10::intrusive_ptr<c10d::ProcessGroup> Strategy::pipeline_group() const { return {}; }

c10::intrusive_ptr<c10d::ProcessGroup> Strategy::context_parallel_group() const { return {}; }

StateDict Strategy::gather_pipeline_state(StateDict local) {
  if (!pipeline_group()) return local;
  c10::impl::GenericDict mine(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : local) mine.insert(name, t.detach().cpu());
  const std::vector<c10::IValue> stages = exchange_pipeline(mine, /*everyone=*/false);
  std::set<std::string> names;
  for (const auto& item : local) names.insert(item.first);
  for (size_t k = 1; k < stages.size(); ++k)  // the first rank only: the later stages' dicts
    for (const auto& item : stages[k].toGenericDict())
      if (names.insert(item.key().toStringRef()).second)
        local.emplace_back(item.key().toStringRef(), item.value().toTensor());
  return local;
}

void Strategy::sync_accumulated_gradients() {
  throw Error("fabric.strategy: " + name() +
              ": cannot synchronize gradients outside a backward pass; pipeline parallelism "
              "needs fabric.strategy: model_parallel");
}

ParameterParts Strategy::parameter_parts(torch::nn::Module& module) {
  ParameterParts out;
  for (const auto& item : module.named_parameters())
    if (item.value().is_floating_point())
      out.parts.push_back(
          {item.key(), item.value().detach(), item.value().sizes().vec(), 0, false});
  return out;
}

torch::Tensor Strategy::clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                            torch::optim::Optimizer& optimizer, double max_norm,
                                            double norm_type) {
  (void)optimizer;
  return clip_grad_norm_on_device(parameters, max_norm, norm_type);
}

void Strategy::clip_gradients_value(const std::vector<torch::Tensor>& parameters,
                                    torch::optim::Optimizer& optimizer, double clip_value) {
  (void)optimizer;
  torch::nn::utils::clip_grad_value_(parameters, clip_value);
}

}  // namespace fabric
