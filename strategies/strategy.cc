#include "strategies/strategy.h"

#include <torch/nn/utils/clip_grad.h>

#include "fabric/checkpoint/archive.h"
#include "fabric/training/clip.h"
#include "strategies/collectives.h"

namespace fabric {

void Strategy::save_checkpoint(const std::filesystem::path& file,
                               const std::function<c10::IValue()>& contents) {
  // Every rank holds the same state: one writer.
  on_global_zero(*this, [&] { save_archive(file, contents()); });
}

c10::IValue Strategy::load_checkpoint(const std::filesystem::path& file) {
  return load_archive(file);
}

torch::Tensor Strategy::clip_gradients_norm(torch::nn::Module& module,
                                            torch::optim::Optimizer& optimizer, double max_norm,
                                            double norm_type) {
  (void)optimizer;
  return clip_grad_norm_on_device(module.parameters(), max_norm, norm_type);
}

void Strategy::clip_gradients_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                    double clip_value) {
  (void)optimizer;
  torch::nn::utils::clip_grad_value_(module.parameters(), clip_value);
}

}  // namespace fabric
