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

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "examples/common/throughput.h"
#include "fabric/checkpointer.h"
#include "fabric/data/augment.h"
#include "fabric/fabric.h"
#include "fabric/graphed_step.h"
#include "fabric/logging/progress.h"
#include "fabric/logging/run_dir.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/stop_signal.h"
#include "fabric/training/ema.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"

namespace examples {

struct ClassificationTask {
  std::string name;  // run directory {name}, e.g. "cifar10"
  std::shared_ptr<const fabric::Dataset> train, test;
  std::string data_kind;  // "real" or "synthetic"
  fabric::BatchTransform train_transform, test_transform;
  // Called on every rank before summary.json is written (may add keys, print, use collectives).
  std::function<void(fabric::Fabric&, nlohmann::json&)> finish = nullptr;
};

// Correct predictions / examples over the test loader (all ranks; summed across ranks; each
// example counted once).
template <typename Model>
double evaluate(fabric::Fabric& f, Model& model, fabric::DataLoader& loader,
                int64_t limit_batches) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto correct = torch::zeros({}, torch::dtype(torch::kLong).device(f.device()));
  auto seen = torch::zeros({}, torch::dtype(torch::kLong).device(f.device()));
  int64_t b = 0;
  for (fabric::Batch& batch : loader) {
    if (limit_batches >= 0 && b++ >= limit_batches) break;
    torch::Tensor logits;
    {
      auto guard = f.autocast();
      logits = f.forward(model, f.precision().convert_input(batch.data));
    }
    // Padded duplicates (the distributed sampler evens out the ranks) are left out, so the
    // accuracy equals the single-process one exactly.
    correct += batch.unpadded(logits.argmax(1)).eq(batch.unpadded(batch.target)).sum();
    seen += batch.size() - batch.padding;
  }
  model->train();
  correct = f.all_reduce(correct, fabric::ReduceOp::kSum);
  seen = f.all_reduce(seen, fabric::ReduceOp::kSum);
  const int64_t n = seen.item<int64_t>();
  return n == 0 ? 0.0 : static_cast<double>(correct.item<int64_t>()) / static_cast<double>(n);
}

// Returns the exit status: 0; 3 (on global rank 0) when training stopped on non-finite losses;
// 143 when SIGTERM stopped a single-process run (a checkpoint of that step saved;
// checkpoint.resume=auto continues).
template <typename Model>
int train_classifier(fabric::Fabric& f, Model& model, const ClassificationTask& task) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const fabric::Config& c = f.config();
  const auto run = f.create_run_directory(task.name);

  auto optimizer = fabric::make_optimizer(c, *model);  // optimizer.no_weight_decay, lr_scale
  f.setup(model, *optimizer);
  // trainer.ema_decay: averaged weights, updated after every optimizer step, used to evaluate
  // (under fsdp each rank averages the part of each parameter it holds).
  std::optional<fabric::ExponentialMovingAverage> ema;
  if (c.get_double("trainer.ema_decay") > 0) {
    ema.emplace(f.parameter_parts(model), c.get_double("trainer.ema_decay"),
                c.get_bool("trainer.ema_warmup"));
  }
  // data.on_device: in-memory datasets move to the GPU once (uint8); batches and their
  // augmentation are then built there.
  const std::string on_device = c.get_string("data.on_device");
  const bool keep_on_device = !f.device().is_cpu() && (on_device == "true" || on_device == "auto");
  auto place = [&](const std::shared_ptr<const fabric::Dataset>& d) {
    const auto t = std::dynamic_pointer_cast<const fabric::TensorDataset>(d);
    return keep_on_device && t ? fabric::device_dataset(*t, f.device()) : d;
  };
  auto train =
      f.setup_dataloader(place(task.train), fabric::DataLoaderOptions()
                                                .batch_size(c.get_int("data.batch_size"))
                                                .shuffle(c.get_bool("data.shuffle"))
                                                .drop_last(c.get_bool("data.drop_last"))
                                                .num_workers(c.get_int("data.num_workers"))
                                                .prefetch(c.get_int("data.prefetch"))
                                                .shuffle_buffer(c.get_int("data.shuffle_buffer"))
                                                .transform(task.train_transform));
  auto test = f.setup_dataloader(place(task.test), fabric::DataLoaderOptions()
                                                       .batch_size(c.get_int("data.batch_size"))
                                                       .num_workers(c.get_int("data.num_workers"))
                                                       .transform(task.test_transform));

  const int64_t max_epochs = c.get_int("trainer.max_epochs");
  const int64_t max_steps = c.get_int("trainer.max_steps");
  // Optimizer steps: with trainer.accumulate_grad_batches K, one per K batches (fewer at an
  // epoch's end); max_steps and the scheduler count these.
  const int64_t accumulate = c.get_int("trainer.accumulate_grad_batches");
  const int64_t epoch_steps = fabric::MicroBatch::steps_in_epoch(train.size(), accumulate);
  const int64_t total_steps =
      max_steps >= 0 ? std::min(max_steps, max_epochs * epoch_steps) : max_epochs * epoch_steps;
  fabric::LRScheduler scheduler(
      *optimizer, fabric::LRSchedule::from_config(c, std::max<int64_t>(total_steps, 1)));
  const int64_t log_every = c.get_int("logging.log_every_n_steps");
  const int64_t eval_every = c.get_int("trainer.eval_every_n_epochs");
  const int64_t limit_eval = c.get_int("trainer.limit_eval_batches");
  const double clip = c.get_double("trainer.gradient_clip_val");
  const bool clip_by_norm = c.get_string("trainer.gradient_clip_algorithm") == "norm";

  f.print(task.name, ": ", task.data_kind, " data, ", task.train->size(), " train / ",
          task.test->size(), " test examples; strategy ", f.strategy().name(), ", world size ",
          f.world_size(), ", device ", f.device().str(), ", precision ",
          fabric::to_string(f.precision().mode()), ", ", f.threads_description(), ", ", total_steps,
          " steps; run directory ", run.path().string());

  // Everything a resume needs; the Checkpointer resumes here when checkpoint.resume says so.
  fabric::CheckpointState state;
  state.add("model", model).add("optimizer", *optimizer).add("scheduler", scheduler);
  state.add("train_loader", train);
  if (ema) ema->add_to(state, "ema");
  // scheduler.name: plateau watching train/loss: the mean loss since the last evaluation (kept
  // identical on every rank, so it resumes exactly from rank 0's checkpoint).
  const bool report_train_loss = c.get_string("scheduler.name") == "plateau" &&
                                 c.get_string("scheduler.monitor") == "train/loss";
  auto loss_since_report = torch::zeros({}, torch::dtype(torch::kDouble).device(f.device()));
  int64_t steps_since_report = 0;
  if (report_train_loss) {
    state.add("loss_since_report", loss_since_report).add("steps_since_report", steps_since_report);
  }
  fabric::Checkpointer checkpoints(f, state, task.name, run.path());

  int64_t step = checkpoints.step(), epoch = checkpoints.epoch(), images = 0;
  double train_seconds = 0, last_loss = NAN, accuracy = NAN;
  auto window_loss = torch::zeros({}, torch::dtype(torch::kFloat).device(f.device()));
  int64_t window = 0, window_images = 0;
  auto window_start = Clock::now();
  // img/s, TFLOP/s and MFU (throughput.* keys); FLOPs counted on the first micro-batch unless
  // throughput.flops_per_unit gives them.
  fabric::Throughput throughput = make_throughput(f);
  fabric::ProgressBar& bar = f.progress_bar(total_steps, max_epochs, step);
  fabric::NonFiniteGuard nonfinite(f);  // trainer.stop_on_nonfinite
  // SIGTERM: checkpoint this step, exit 143. Single-process runs only: in a multi-rank job a
  // SIGTERM from the launcher usually means another rank failed, and a rank blocked in a
  // collective with a dead peer would only end at the launcher's SIGKILL, seconds later.
  std::optional<fabric::StopSignal> stop_signal;
  if (f.world_size() == 1) stop_signal.emplace(f, log_every);
  bool signalled = false;
  auto loss_of = [&](const torch::Tensor& data, const torch::Tensor& target) {
    auto guard = f.autocast();
    return torch::cross_entropy_loss(f.forward(model, f.precision().convert_input(data)), target);
  };
  // One whole step (clipping included), replayed as a CUDA graph with fabric.cuda_graphs (eager
  // otherwise).
  fabric::GraphedStepOptions step_options;
  if (clip_by_norm) {
    step_options.clip_norm(clip);
  } else {
    step_options.clip_value(clip);
  }
  fabric::GraphedStep train_step(
      f, *optimizer, [&](const std::vector<torch::Tensor>& b) { return loss_of(b[0], b[1]); },
      step_options);
  std::string stopped;
  for (; epoch < max_epochs && step < total_steps; ++epoch) {
    const auto epoch_start = Clock::now();
    torch::Tensor group_loss;
    int64_t in_epoch = train.state().batches;  // where this pass starts (a resume: mid-epoch)
    for (fabric::Batch& batch : train) {
      const auto micro = fabric::MicroBatch::in_epoch(in_epoch++, train.size(), accumulate);
      torch::Tensor micro_loss;
      if (!throughput.has_flops()) {  // the first micro-batch: count its FLOPs (FlopCounter)
        fabric::FlopCounter counter;
        micro_loss = train_step({batch.data, batch.target}, micro);
        throughput.set_flops_per_unit(counter.total() / static_cast<double>(batch.target.size(0)),
                                      "counted");
      } else {
        micro_loss = train_step({batch.data, batch.target}, micro);
      }
      group_loss = micro.first() ? micro_loss : group_loss + micro_loss;
      window_images += batch.target.size(0);
      images += batch.target.size(0);
      if (!micro.last()) continue;
      // The step's loss: the mean over its micro-batches.
      const torch::Tensor loss = micro.count == 1 ? group_loss : group_loss / micro.count;
      scheduler.step();
      if (ema) ema->update();
      ++step;
      window_loss += loss.detach().to(torch::kFloat);  // no host sync until the progress line
      ++window;
      if (report_train_loss) {  // the mean over ranks, so every rank (and rank 0's
                                // checkpoint) holds the same sum: one scalar all-reduce a step
        loss_since_report += f.all_reduce(loss.detach().to(torch::kDouble));
        ++steps_since_report;
      }
      if (step % log_every == 0 || step == total_steps) {
        last_loss = f.all_reduce(window_loss / static_cast<double>(window)).item<double>();
        const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
        const auto rates = throughput.rates(static_cast<double>(window_images), secs);
        bar.set_metrics(last_loss, scheduler.get_lr(), rates.job);
        if (rates.mfu >= 0) bar.set_throughput(rates.job, "img/s", rates.mfu);
        auto metrics = fabric::Throughput::metrics(rates, "images");
        metrics["train/loss"] = last_loss;
        metrics["lr"] = scheduler.get_lr();
        metrics["epoch"] = static_cast<double>(epoch + 1);
        f.log_dict(metrics, step);
        window_loss.zero_();
        window = 0;
        window_images = 0;
        window_start = Clock::now();
      }
      bar.step(step, epoch);
      checkpoints.step_end();
      if (nonfinite.update(loss, step)) {
        stopped = nonfinite.message();
        break;
      }
      if (stop_signal && stop_signal->requested(step)) {
        signalled = true;
        stopped = "stopped by SIGTERM at step " + std::to_string(step);
        break;
      }
      if (step >= total_steps) break;  // before taking a batch this run would not train on
    }
    train_seconds += std::chrono::duration<double>(Clock::now() - epoch_start).count();
    if (!stopped.empty()) break;
    const bool last = epoch + 1 == max_epochs || step >= total_steps;
    if (last || (eval_every > 0 && (epoch + 1) % eval_every == 0)) {
      const auto eval_start = Clock::now();
      {
        auto averaged = ema ? ema->swap_into_model() : fabric::ScopeGuard();
        accuracy = evaluate(f, model, test, limit_eval);
      }
      f.print("epoch ", epoch + 1, " test accuracy ", accuracy);
      f.log_dict({{"test/accuracy", accuracy}, {"epoch", static_cast<double>(epoch + 1)}}, step);
      if (c.get_string("scheduler.name") == "plateau") {
        // Every rank reports the same (all-reduced) value; metrics.csv shows what was reported.
        double monitored = accuracy;
        if (report_train_loss) {
          const double steps = static_cast<double>(std::max<int64_t>(steps_since_report, 1));
          monitored = (loss_since_report / steps).item<double>();
          loss_since_report.zero_();
          steps_since_report = 0;
        }
        scheduler.report(monitored);
        f.log_dict({{"scheduler/monitored", monitored}}, step);
      }
      window_start += Clock::now() - eval_start;  // keep evaluation out of the img/s window
    }
    checkpoints.epoch_end();
  }
  bar.finish();
  std::string nonfinite_checkpoint;
  if (signalled) {
    const std::filesystem::path saved = checkpoints.save();
    f.print(stopped, "; the state is in ", saved.empty() ? "(not saved)" : saved.string(),
            " (checkpoint.resume=auto continues from it)");
  } else if (stopped.empty()) {
    checkpoints.finish();
    if (ema && !checkpoints.export_weights().empty()) {  // beside them: <stem>_ema<ext>
      const std::filesystem::path weights = checkpoints.export_weights();
      auto averaged = ema->swap_into_model();
      f.save_weights(model, (weights.parent_path() /
                             (weights.stem().string() + "_ema" + weights.extension().string()))
                                .string());
    }
  } else {
    nonfinite_checkpoint = checkpoints.save_aside("nonfinite").string();
    f.print("stopped: ", stopped, "; the state is in ", nonfinite_checkpoint,
            " (never resumed from automatically); lower optimizer.lr, clip gradients "
            "(trainer.gradient_clip_val) or check the data");
  }

  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const auto run_rates = throughput.rates(static_cast<double>(images), train_seconds);
  nlohmann::json summary = {
      {"name", task.name},
      {"config_hash", c.hash()},
      {"strategy", f.strategy().name()},
      {"precision", fabric::to_string(f.precision().mode())},
      {"device", f.device().str()},
      {"world_size", f.world_size()},
      {"threads", at::get_num_threads()},
      {"data", task.data_kind},
      {"epochs", epoch},
      {"steps", step},
      {"train_loss", last_loss},
      {"test_accuracy", accuracy},
      {"images_per_second", run_rates.job},
      {"images_per_second_per_rank", run_rates.per_rank},
      {"flops_per_sample", throughput.flops_per_unit()},
      {"flops_source", throughput.flops_source()},
      {"tflops",
       run_rates.tflops >= 0 ? nlohmann::json(run_rates.tflops) : nlohmann::json(nullptr)},
      {"mfu", run_rates.mfu >= 0 ? nlohmann::json(run_rates.mfu) : nlohmann::json(nullptr)},
      {"wall_seconds", wall},
      {"ema_decay", c.get_double("trainer.ema_decay")},
      {"skipped_steps", f.precision().scaler() ? f.precision().scaler()->skipped_steps() : 0},
      {"run_dir", run.path().string()},
      {"resumed_from", checkpoints.resumed_from()},
      {"restart_attempt", checkpoints.restart_attempt()},
      {"checkpoint_dir", checkpoints.dir().string()},
      {"stopped", stopped},
      {"nonfinite_checkpoint", nonfinite_checkpoint},
  };
  if (task.finish) task.finish(f, summary);
  const auto summary_path = run.write_summary(summary);
  f.print(summary_path.string());
  if (signalled) return fabric::StopSignal::kExitStatus;
  return !stopped.empty() && f.is_global_zero() ? 3 : 0;
}

}  // namespace examples

#endif  // EXAMPLES_COMMON_CLASSIFICATION_H_
