// How many optimizer steps an example program's loop takes: one per trainer.accumulate_grad_batches
// batches of the train loader in an epoch (fewer at an epoch's end), trainer.max_epochs of them,
// at most trainer.max_steps (-1: no limit). One place for examples:gpt, examples:finetune and the
// classification programs, which refuse a run that would take none.
#ifndef EXAMPLES_COMMON_STEPS_H_
#define EXAMPLES_COMMON_STEPS_H_

#include <cstdint>
#include <string>

#include "fabric/fabric.h"

namespace examples {

struct StepCount {
  int64_t accumulate = 1;   // trainer.accumulate_grad_batches
  int64_t epoch_steps = 0;  // optimizer steps in one epoch
  int64_t total_steps = 0;  // in the run
};

// fabric::ConfigError at data.drop_last when it leaves the train loader no full batch
// (`train_batches` 0: fewer than data.batch_size `examples` on a data-parallel replica) while
// trainer.max_steps is not 0: no step would run, and the export after the loop would write the
// untrained start as the result. `unit` names what the examples are ("examples", "windows").
StepCount count_steps(const fabric::Fabric& f, int64_t train_batches, int64_t examples,
                      int64_t batch_size, const std::string& unit = "examples");

// After a resume: the run's optimizer steps counted from where it stands, the checkpoint's `step`
// and `epoch`, `batches_done` of the current epoch's `batches` (the train loader's state and size
// after the load), then the remaining epochs of `planned`. Equal to planned.total_steps when the
// run resumes in the shape it was saved in; at another world size, batch size or
// trainer.accumulate_grad_batches the saved steps were another shape's, and the plan made before
// the load would cut the data short or run past it. When the count changes, rank 0 prints one
// line giving both and saying that the learning-rate schedule keeps its horizon.
int64_t steps_after_resume(const fabric::Fabric& f, const StepCount& planned, int64_t step,
                           int64_t epoch, int64_t batches_done, int64_t batches);

}  // namespace examples

#endif  // EXAMPLES_COMMON_STEPS_H_
