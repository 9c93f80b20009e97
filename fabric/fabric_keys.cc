// Fabric and the keys of its config a program may leave to it: model.init_weights (applied by
// setup), trainer.gradient_clip_val (applied by step), and the report of keys nothing read
// (fabric.strict_keys). docs/training.md, "Keys your loop reads".
#include <torch/types.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "fabric/fabric.h"

namespace fabric {
namespace {

// Whether `config` declares `path` and nothing has read it yet.
bool unclaimed(const Config& config, const std::string& path) {
  return config.schema().find(path) != nullptr && !config.was_read(path);
}

}  // namespace

void Fabric::apply_init_weights(torch::nn::Module& module) {
  if (init_weights_decided_) return;
  init_weights_decided_ = true;
  if (!unclaimed(config_, "model.init_weights")) return;
  const std::string path = config_.get_string("model.init_weights");
  if (path == "none") return;
  try {
    load_weights_of(module, path);
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw config_.error_at("model.init_weights", e.what());
  }
  print("model.init_weights: loaded ", path, " into the model (the first module set up)");
}

void Fabric::clip_for_config(torch::optim::Optimizer& optimizer) {
  if (!config_clip_) {
    config_clip_ = 0.0;
    if (unclaimed(config_, "trainer.gradient_clip_val")) {
      config_clip_ = config_.get_double("trainer.gradient_clip_val");
      config_clip_by_value_ = config_.schema().find("trainer.gradient_clip_algorithm") &&
                              config_.get_string("trainer.gradient_clip_algorithm") == "value";
    }
  }
  const bool clipped = clipped_since_step_;
  clipped_since_step_ = false;
  if (*config_clip_ <= 0 || clipped) return;
  std::vector<torch::Tensor> parameters;
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) parameters.push_back(p);
  precision().unscale_gradients(optimizer);
  if (config_clip_by_value_) {
    strategy_->clip_gradients_value(parameters, optimizer, *config_clip_);
  } else {
    strategy_->clip_gradients_norm(parameters, optimizer, *config_clip_, 2.0);
  }
}

int Fabric::report_unread_keys(int status) {
  if (!is_global_zero()) return status;
  const bool strict = config_.schema().find("fabric.strict_keys") != nullptr &&
                      config_.get_bool("fabric.strict_keys");
  const std::vector<UnreadKey> unread = config_.unread_keys();
  if (unread.empty()) return status;
  std::string list;
  for (const auto& k : unread)
    list += (list.empty() ? "" : ", ") + k.path + ": " + k.value + " (" + k.origin + ")";
  const std::string what =
      std::to_string(unread.size()) +
      (unread.size() == 1 ? " key the config sets was" : " keys the config sets were") +
      " never read by this program, so " + (unread.size() == 1 ? "it" : "they") +
      " had no effect: " + list;
  const std::string fix =
      "read them in your loop (or let Fabric apply them: docs/training.md, \"Keys your loop "
      "reads\") or remove them";
  if (strict && status == 0) {
    std::cerr << "error: fabric.strict_keys: " << what << "; " << fix << std::endl;
    return 2;
  }
  std::cerr << "warning: " << what << "; " << fix
            << " (fabric.strict_keys: true makes this an error)" << std::endl;
  return status;
}

namespace {

// A hint for an error under tensor parallelism whose words do not say it: reshaping split heads
// with the model's whole head count.
std::string tensor_parallel_hint(const std::exception& e, int64_t tp) {
  if (tp <= 1 || std::string(e.what()).find("is invalid for input of size") == std::string::npos)
    return "";
  return "; under tensor parallelism (tp " + std::to_string(tp) +
         ") each rank holds n_head / tp heads: reshape with -1 or fabric::nn::local_heads(layer, "
         "n_head), not n_head (docs/tensor_parallel.md)";
}

// The Reducer's error for a parameter without a gradient names Python's
// DistributedDataParallel(find_unused_parameters=True): the key that does it here.
std::string unused_parameters_hint(const std::exception& e) {
  if (std::string(e.what()).find("Expected to have finished reduction in the prior iteration") ==
      std::string::npos)
    return "";
  return "; under ddp every parameter that requires a gradient must get one in every backward: "
         "set fabric.ddp.find_unused_parameters: true (or freeze the parameters the loss does "
         "not use)";
}

}  // namespace

std::string Fabric::error_site(const std::exception& e) const {
  return phase_description() +
         tensor_parallel_hint(e, world_size() / std::max<int64_t>(data_parallel_size(), 1)) +
         unused_parameters_hint(e);
}

std::string Fabric::phase_description() const {
  const std::string after = std::to_string(steps_) +
                            (steps_ == 1 ? " optimizer step" : " optimizer steps") +
                            " of this process";
  switch (phase_) {
    case Phase::kBeforeSetup:
      return "before setup";
    case Phase::kSetup:
      return "in setup";
    case Phase::kForward:
      return "in forward (the loop's code before backward), after " + after;
    case Phase::kBackward:
      return "in backward, after " + after;
    case Phase::kAfterBackward:
      return "between backward and the optimizer step, after " + after;
    case Phase::kStep:
      return "in optimizer step " + std::to_string(steps_ + 1);
    case Phase::kEvaluate:
      return "in evaluate, after " + after;
    case Phase::kAfterEvaluate:
      return "in the loop's code after evaluate, after " + after;
    case Phase::kSave:
      return "while saving a checkpoint, after " + after;
    case Phase::kLoad:
      return "while loading a checkpoint or weights, after " + after;
  }
  return "";
}

}  // namespace fabric
