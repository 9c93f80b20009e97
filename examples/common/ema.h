// The examples' averaged weights, from trainer.ema_decay / trainer.ema_warmup
// (configs/README.md): fabric::ExponentialMovingAverage over the part of each parameter this
// rank holds (whole, fsdp's run, or model_parallel's run of its slice), and the averaged weights
// exported beside the trained ones.
#ifndef EXAMPLES_COMMON_EMA_H_
#define EXAMPLES_COMMON_EMA_H_

#include <torch/nn/module.h>

#include <filesystem>
#include <memory>

#include "fabric/fabric.h"
#include "fabric/training/ema.h"

namespace examples {

// Null when trainer.ema_decay is 0. Call after f.setup(module, ...).
inline std::unique_ptr<fabric::ExponentialMovingAverage> make_ema(fabric::Fabric& f,
                                                                  torch::nn::Module& module) {
  const fabric::Config& c = f.config();
  if (c.get_double("trainer.ema_decay") <= 0) return nullptr;
  return std::make_unique<fabric::ExponentialMovingAverage>(f.parameter_parts(module),
                                                            c.get_double("trainer.ema_decay"),
                                                            c.get_bool("trainer.ema_warmup"));
}

// The averaged weights as <stem>_ema<ext> beside `exported` (the trained weights'
// checkpoint.export_weights file); nothing when either is missing. Collective.
inline void export_ema_weights(fabric::Fabric& f, torch::nn::Module& module,
                               fabric::ExponentialMovingAverage* ema,
                               const std::filesystem::path& exported) {
  if (ema == nullptr || exported.empty()) return;
  auto averaged = ema->swap_into_model();
  f.save_weights(module, (exported.parent_path() /
                          (exported.stem().string() + "_ema" + exported.extension().string()))
                             .string());
}

}  // namespace examples

#endif  // EXAMPLES_COMMON_EMA_H_
