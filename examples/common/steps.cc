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

int64_t steps_after_resume(const fabric::Fabric& f, const StepCount& planned, int64_t step,
                           int64_t epoch, int64_t batches_done, int64_t batches) {
  const fabric::Config& c = f.config();
  const int64_t max_epochs = c.get_int("trainer.max_epochs");
  const int64_t max_steps = c.get_int("trainer.max_steps");
  if (step == 0 || epoch >= max_epochs) return planned.total_steps;
  const int64_t rest = fabric::MicroBatch::steps_in_epoch(
                           std::max<int64_t>(0, batches - batches_done), planned.accumulate) +
                       (max_epochs - epoch - 1) * planned.epoch_steps;
  const int64_t total = max_steps >= 0 ? std::min(max_steps, step + rest) : step + rest;
  if (total != planned.total_steps)
    f.print("resumed at step ", step, " with ", rest,
            " step(s) of data left at this world size, batch size and accumulation: ", total,
            " steps in all, not the ", planned.total_steps,
            " a fresh run plans; the learning-rate schedule keeps its horizon of ",
            planned.total_steps,
            total > planned.total_steps ? " (the steps past it run at its final rate)" : "");
  return total;
}

}  // namespace examples
