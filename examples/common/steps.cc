#include "examples/common/steps.h"

#include <algorithm>

#include "fabric/training/accumulation.h"

namespace examples {

StepCount count_steps(const fabric::Fabric& f, int64_t train_batches, int64_t examples,
                      int64_t batch_size, const std::string& unit) {
  const fabric::Config& c = f.config();
  StepCount s;
  s.accumulate = c.get_int("trainer.accumulate_grad_batches");
  s.epoch_steps = fabric::MicroBatch::steps_in_epoch(train_batches, s.accumulate);
  const int64_t max_epochs = c.get_int("trainer.max_epochs");
  const int64_t max_steps = c.get_int("trainer.max_steps");
  s.total_steps =
      max_steps >= 0 ? std::min(max_steps, max_epochs * s.epoch_steps) : max_epochs * s.epoch_steps;
  if (s.epoch_steps == 0 && max_steps != 0 && max_epochs != 0 && c.get_bool("data.drop_last")) {
    const int64_t replicas = f.data_parallel_size();  // the sampler splits the data over these
    const bool fewer = examples < replicas;           // no batch size helps then
    throw c.error_at(
        "data.drop_last",
        "true leaves no full batch: the training data's " + std::to_string(examples) + " " + unit +
            " over " + std::to_string(replicas) + " data-parallel replica(s) at data.batch_size " +
            std::to_string(batch_size) + " make 0 steps; set data.drop_last=false" +
            (fewer ? " or give more " + unit : std::string(" or lower data.batch_size")));
  }
  return s;
}

}  // namespace examples
