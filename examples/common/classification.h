// The training loop both examples share: this is the code a user writes with Fabric (setup,
// loaders, autocast, backward, step), plus evaluation, progress lines and the run summary.
//
// Config keys used: trainer.* (max_epochs, max_steps, eval_every_n_epochs, limit_eval_batches,
// accumulate_grad_batches, ema_decay, ema_warmup, gradient_clip_*), data.* (batch_size, shuffle,
// drop_last, num_workers, prefetch), optimizer.*, scheduler.*, logging.* (run_dir,
// log_every_n_steps), checkpoint.* (fabric/checkpointer.h: saves, rotation, resume: auto after a
// crash, weights for Python at the end), throughput.* (examples/common/throughput.h). Metrics
// (logging.loggers: csv): train/loss, lr, train/images_per_second (+ _per_rank), train/tflops
// (+ _per_rank; FLOPs counted on the first micro-batch), train/mfu (where the peak is known),
// epoch at every progress line and test/accuracy at every evaluation, by step, in
// <run dir>/metrics.csv.
//
// Output (rank 0): the progress bar (logging.progress_bar: in place on a terminal, else a line
// every log_every_n_steps), one line per evaluation, and, last, the path of summary.json.
#ifndef EXAMPLES_COMMON_CLASSIFICATION_H_
#define EXAMPLES_COMMON_CLASSIFICATION_H_

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "fabric/data/augment.h"
#include "fabric/fabric.h"

namespace examples {

struct ClassificationTask {
  std::string name;  // run directory {name}, e.g. "cifar10"
  std::shared_ptr<const fabric::Dataset> train, test;
  std::string data_kind;  // "real" or "synthetic"
  fabric::BatchTransform train_transform, test_transform;
  // Called on every rank before summary.json is written (may add keys, print, use collectives).
  std::function<void(fabric::Fabric&, nlohmann::json&)> finish = nullptr;
};

// The model as the loop sees it: its parameters and buffers, and its forward through
// Fabric::forward (which needs the model's own type under fabric.strategy: dp).
struct ClassifierModel {
  torch::nn::Module& module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
};

// Correct predictions / examples over the test loader (all ranks; summed across ranks; each
// example counted once).
double evaluate(fabric::Fabric& f, const ClassifierModel& model, fabric::DataLoader& loader,
                int64_t limit_batches);

// The loop (examples/common/classification.cc). Returns the exit status: 0; 3 (on global rank 0)
// when training stopped on non-finite losses; 143 when SIGTERM stopped a single-process run (a
// checkpoint of that step saved; checkpoint.resume=auto continues).
int train_classifier(fabric::Fabric& f, const ClassifierModel& model,
                     const ClassificationTask& task);

// The same for a module holder (e.g. examples::ResNet18Cifar).
template <typename Model>
int train_classifier(fabric::Fabric& f, Model& model, const ClassificationTask& task) {
  return train_classifier(
      f,
      ClassifierModel{static_cast<torch::nn::Module&>(*model),
                      [&f, &model](const torch::Tensor& x) { return f.forward(model, x); }},
      task);
}

}  // namespace examples

#endif  // EXAMPLES_COMMON_CLASSIFICATION_H_
