// The shared classification loop (classification.h), compiled once for every example: setup,
// the epoch loop, evaluation, the end of training and the run summary, each a member of
// ClassifierLoop in the order a run meets them.
#include "examples/common/classification.h"

#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "examples/common/ema.h"
#include "examples/common/evaluations.h"
#include "examples/common/steps.h"
#include "examples/common/throughput.h"
#include "fabric/accelerators/memory.h"
#include "fabric/callbacks.h"
#include "fabric/checkpointer.h"
#include "fabric/graphed_step.h"
#include "fabric/logging/progress.h"
#include "fabric/logging/run_dir.h"
#include "fabric/nonfinite_guard.h"
#include "fabric/stop_signal.h"
#include "fabric/training/lr_scheduler.h"
#include "fabric/training/optimizers.h"

namespace examples {
namespace {

using Clock = std::chrono::steady_clock;

// The trainer: and data: keys the loop reads, once.
struct LoopSettings {
  int64_t max_epochs = 0, total_steps = 0, accumulate = 1, epoch_steps = 0, log_every = 1,
          eval_every = 0, limit_eval = -1;
  double clip = 0;
  bool clip_by_norm = false;
  // scheduler.name: plateau watching train/loss: the mean loss since the last evaluation (kept
  // identical on every rank, so it resumes exactly from rank 0's checkpoint).
  bool plateau = false, report_train_loss = false;

  static LoopSettings read(const fabric::Fabric& f, int64_t train_batches, int64_t examples,
                           int64_t batch_size) {
    const fabric::Config& c = f.config();
    LoopSettings s;
    s.max_epochs = c.get_int("trainer.max_epochs");
    // Optimizer steps: with trainer.accumulate_grad_batches K, one per K batches (fewer at an
    // epoch's end); max_steps and the scheduler count these. None under data.drop_last: refused.
    const StepCount steps = count_steps(f, train_batches, examples, batch_size);
    s.accumulate = steps.accumulate;
    s.epoch_steps = steps.epoch_steps;
    s.total_steps = steps.total_steps;
    s.log_every = c.get_int("logging.log_every_n_steps");
    s.eval_every = c.get_int("trainer.eval_every_n_epochs");
    s.limit_eval = c.get_int("trainer.limit_eval_batches");
    s.clip = c.get_double("trainer.gradient_clip_val");
    s.clip_by_norm = c.get_string("trainer.gradient_clip_algorithm") == "norm";
    s.plateau = c.get_string("scheduler.name") == "plateau";
    s.report_train_loss = s.plateau && c.get_string("scheduler.monitor") == "train/loss";
    return s;
  }
};

// data.on_device: in-memory datasets move to the GPU once (uint8); batches and their
// augmentation are then built there.
std::shared_ptr<const fabric::Dataset> place(fabric::Fabric& f,
                                             const std::shared_ptr<const fabric::Dataset>& d) {
  const std::string on_device = f.config().get_string("data.on_device");
  const bool keep_on_device = !f.device().is_cpu() && (on_device == "true" || on_device == "auto");
  const auto t = std::dynamic_pointer_cast<const fabric::TensorDataset>(d);
  return keep_on_device && t ? fabric::device_dataset(*t, f.device()) : d;
}

fabric::DataLoader train_loader(fabric::Fabric& f, const ClassificationTask& task,
                                int64_t batch_size) {
  const fabric::Config& c = f.config();
  return f.setup_dataloader(place(f, task.train),
                            fabric::DataLoaderOptions()
                                .batch_size(batch_size)
                                .shuffle(c.get_bool("data.shuffle"))
                                .drop_last(c.get_bool("data.drop_last"))
                                .num_workers(c.get_int("data.num_workers"))
                                .prefetch(c.get_int("data.prefetch"))
                                .shuffle_buffer(c.get_int("data.shuffle_buffer"))
                                .transform(task.train_transform));
}

fabric::DataLoader test_loader(fabric::Fabric& f, const ClassificationTask& task,
                               int64_t batch_size) {
  const fabric::Config& c = f.config();
  return f.setup_dataloader(place(f, task.test), fabric::DataLoaderOptions()
                                                     .batch_size(batch_size)
                                                     .num_workers(c.get_int("data.num_workers"))
                                                     .transform(task.test_transform));
}

// The optimizer (optimizer.no_weight_decay, lr_scale), set up with the model (which gets the
// weights of model.init_weights there, if any; a checkpoint resumed later replaces them).
std::unique_ptr<torch::optim::Optimizer> set_up_optimizer(fabric::Fabric& f,
                                                          const ClassifierModel& model) {
  auto optimizer = fabric::make_optimizer(f.config(), model.module);
  f.setup(model.module, *optimizer);
  return optimizer;
}

nlohmann::json null_if_negative(double value) {
  return value >= 0 ? nlohmann::json(value) : nlohmann::json(nullptr);
}

// data.batch_size, resolving auto (Fabric::find_batch_size): each trial takes the first batch of
// a loader of that size through the training step. From 8, doubling, up to 4096 and this
// process's share of the data.
int64_t resolve_batch_size(fabric::Fabric& f, const ClassifierModel& model,
                           const ClassificationTask& task, torch::optim::Optimizer& optimizer,
                           std::vector<fabric::Fabric::BatchSizeTrial>* trials) {
  const fabric::Config& c = f.config();
  if (!c.is_auto("data.batch_size")) return c.get_int("data.batch_size");
  const int64_t most =
      std::min<int64_t>(4096, std::max<int64_t>(1, task.train->size() / f.data_parallel_size()));
  const auto loss = [&](int64_t b) {
    fabric::DataLoader loader = train_loader(f, task, b);
    const fabric::Batch batch = *loader.begin();
    return torch::cross_entropy_loss(model.forward(f.precision().convert_input(batch.data)),
                                     batch.target);
  };
  return f.find_batch_size(model.module, optimizer, loss, std::min<int64_t>(8, most), most, trials);
}

class ClassifierLoop {
 public:
  ClassifierLoop(fabric::Fabric& f, const ClassifierModel& model, const ClassificationTask& task)
      : f_(f),
        model_(model),
        task_(task),
        c_(f.config()),
        run_(f.create_run_directory(task.name)),
        optimizer_(set_up_optimizer(f, model)),
        ema_(examples::make_ema(f, model.module)),
        batch_size_(resolve_batch_size(f, model, task, *optimizer_, &batch_size_trials_)),
        train_(train_loader(f, task, batch_size_)),
        test_(test_loader(f, task, batch_size_)),
        s_(LoopSettings::read(f, train_.size(), task.train->size(), batch_size_)),
        scheduler_(*optimizer_,
                   fabric::LRSchedule::from_config(c_, std::max<int64_t>(s_.total_steps, 1))) {
    f.print(task.name, ": ", task.data_kind, " data, ", task.train->size(), " train / ",
            task.test->size(), " test examples; strategy ", f.strategy().name(), ", world size ",
            f.world_size(), ", device ", f.device().str(), ", precision ",
            fabric::to_string(f.precision().mode()), ", ", f.threads_description(), ", ",
            s_.total_steps, " steps; run directory ", run_.path().string());
    for (auto& callback : fabric::make_callbacks(c_, &model.module, optimizer_.get()))
      f.add_callback(std::move(callback));
    resume();
    // img/s, TFLOP/s and MFU (throughput.* keys); FLOPs counted on the first micro-batch unless
    // throughput.flops_per_unit gives them.
    throughput_.emplace(make_throughput(f));
    bar_ = &f.progress_bar(s_.total_steps, s_.max_epochs, step_);
    nonfinite_.emplace(f);  // trainer.stop_on_nonfinite
    // SIGTERM: checkpoint this step, exit 143. Single-process runs only: in a multi-rank job a
    // SIGTERM from the launcher usually means another rank failed, and a rank blocked in a
    // collective with a dead peer would only end at the launcher's SIGKILL, seconds later.
    if (f.world_size() == 1) stop_signal_.emplace(f, s_.log_every);
    // One whole step (clipping included), replayed as a CUDA graph with fabric.cuda_graphs
    // (eager otherwise).
    fabric::GraphedStepOptions step_options;
    if (s_.clip_by_norm) {
      step_options.clip_norm(s_.clip);
    } else {
      step_options.clip_value(s_.clip);
    }
    train_step_.emplace(
        f, *optimizer_, [this](const std::vector<torch::Tensor>& b) { return loss_of(b[0], b[1]); },
        step_options);
  }

  int run() {
    f_.call("on_fit_start", step_);
    for (; epoch_ < s_.max_epochs && step_ < s_.total_steps; ++epoch_) {
      const auto epoch_start = Clock::now();
      train_epoch();
      train_seconds_ += std::chrono::duration<double>(Clock::now() - epoch_start).count();
      if (!stopped_.empty()) break;
      const bool last = epoch_ + 1 == s_.max_epochs || step_ >= s_.total_steps;
      if (last || (s_.eval_every > 0 && (epoch_ + 1) % s_.eval_every == 0)) evaluate_epoch();
      checkpoints_->epoch_end();
      // Callbacks (callbacks.* keys): every rank leaves at the same epoch, rank 0 deciding.
      if (!f_.callbacks().empty() && f_.should_stop()) {
        f_.print(f_.stop_reason());
        ++epoch_;
        break;
      }
    }
    bar_->finish();
    end_training();
    // The most tensor memory any rank held (fabric/accelerators/memory.h), where it was counted
    // from the start: CUDA, or the CPU under fabric.tensor_memory_limit_gb.
    if (fabric::memory_counted(f_.device()))
      peak_tensor_bytes_ = f_.all_reduce(
          static_cast<double>(fabric::memory_stats(f_.device()).peak), fabric::ReduceOp::kMax);
    nlohmann::json summary = this->summary();
    if (task_.finish) task_.finish(f_, summary);
    const auto summary_path = run_.write_summary(summary);
    f_.print(summary_path.string());
    if (signalled_) return fabric::StopSignal::kExitStatus;
    return !stopped_.empty() && f_.is_global_zero() ? 3 : 0;
  }

 private:
  // Everything a resume needs; the Checkpointer resumes here when checkpoint.resume says so.
  void resume() {
    state_.add("model", model_.module).add("optimizer", *optimizer_).add("scheduler", scheduler_);
    state_.add("train_loader", train_);
    if (ema_) ema_->add_to(state_, "ema");
    fabric::add_stateful_callbacks(f_, state_);  // a stateful callback resumes where it was
    loss_since_report_ = torch::zeros({}, torch::dtype(torch::kDouble).device(f_.device()));
    if (s_.report_train_loss) {
      state_.add("loss_since_report", loss_since_report_)
          .add("steps_since_report", steps_since_report_);
    }
    checkpoints_.emplace(f_, state_, task_.name, run_.path());
    step_ = checkpoints_->step();
    epoch_ = checkpoints_->epoch();
    s_.total_steps = examples::steps_after_resume(
        f_, examples::StepCount{s_.accumulate, s_.epoch_steps, s_.total_steps}, step_, epoch_,
        train_.state().batches, train_.size());
    window_loss_ = torch::zeros({}, torch::dtype(torch::kFloat).device(f_.device()));
    window_start_ = Clock::now();
  }

  torch::Tensor loss_of(const torch::Tensor& data, const torch::Tensor& target) {
    auto guard = f_.autocast();
    return torch::cross_entropy_loss(model_.forward(f_.precision().convert_input(data)), target);
  }

  // One pass over the training data (from where a resume left it), until the epoch ends,
  // total_steps are done, or the run stops (stopped_ says why).
  void train_epoch() {
    torch::Tensor group_loss;
    // Micro-batches group from where this pass starts (a resume: mid-epoch), so a resume with
    // another trainer.accumulate_grad_batches starts a whole group (at the saver's, the same).
    const int64_t start = train_.state().batches;
    int64_t in_epoch = start;
    for (fabric::Batch& batch : train_) {
      const auto micro =
          fabric::MicroBatch::in_epoch(in_epoch++ - start, train_.size() - start, s_.accumulate);
      torch::Tensor micro_loss;
      if (!throughput_->has_flops()) {  // the first micro-batch: count its FLOPs (FlopCounter)
        fabric::FlopCounter counter;
        micro_loss = (*train_step_)({batch.data, batch.target}, micro);
        throughput_->set_flops_per_unit(counter.total() / static_cast<double>(batch.target.size(0)),
                                        "counted");
      } else {
        micro_loss = (*train_step_)({batch.data, batch.target}, micro);
      }
      group_loss = micro.first() ? micro_loss : group_loss + micro_loss;
      window_images_ += batch.target.size(0);
      images_ += batch.target.size(0);
      if (!micro.last()) continue;
      // The step's loss: the mean over its micro-batches.
      const torch::Tensor loss = micro.count == 1 ? group_loss : group_loss / micro.count;
      if (!step_done(loss)) break;
    }
  }

  // After an optimizer step: scheduler, EMA, the loss window, logging, checkpoints and the stop
  // checks. False when the epoch's pass ends here.
  bool step_done(const torch::Tensor& loss) {
    scheduler_.step();
    if (ema_) ema_->update();
    ++step_;
    f_.call("on_train_batch_end", step_);  // no loss value: that would sync with the device
    window_loss_ += loss.detach().to(torch::kFloat);  // no host sync until the progress line
    ++window_;
    if (s_.report_train_loss) {  // the mean over ranks, so every rank (and rank 0's
                                 // checkpoint) holds the same sum: one scalar all-reduce a step
      loss_since_report_ += f_.all_reduce(loss.detach().to(torch::kDouble));
      ++steps_since_report_;
    }
    if (step_ % s_.log_every == 0 || step_ == s_.total_steps) log_window();
    bar_->step(step_, epoch_);
    checkpoints_->step_end();
    if (nonfinite_->update(loss, step_)) {
      stopped_ = nonfinite_->message();
      return false;
    }
    if (stop_signal_ && stop_signal_->requested(step_)) {
      signalled_ = true;
      stopped_ = "stopped by SIGTERM at step " + std::to_string(step_);
      return false;
    }
    return step_ < s_.total_steps;  // not taking a batch this run would not train on
  }

  // The progress line and metrics of the steps since the last one.
  void log_window() {
    last_loss_ = f_.all_reduce(window_loss_ / static_cast<double>(window_)).item<double>();
    const double secs = std::chrono::duration<double>(Clock::now() - window_start_).count();
    const auto rates = throughput_->rates(static_cast<double>(window_images_), secs);
    bar_->set_metrics(last_loss_, scheduler_.get_lr(), rates.job);
    if (rates.mfu >= 0) bar_->set_throughput(rates.job, "img/s", rates.mfu);
    auto metrics = fabric::Throughput::metrics(rates, "images");
    metrics["train/loss"] = last_loss_;
    metrics["lr"] = scheduler_.get_lr();
    metrics["epoch"] = static_cast<double>(epoch_ + 1);
    f_.log_dict(metrics, step_);
    window_loss_.zero_();
    window_ = 0;
    window_images_ = 0;
    window_start_ = Clock::now();
  }

  // Test accuracy (with the EMA weights when there are some), logged; the plateau scheduler's
  // report.
  void evaluate_epoch() {
    const auto eval_start = Clock::now();
    {
      auto averaged = ema_ ? ema_->swap_into_model() : fabric::ScopeGuard();
      accuracy_ = evaluate(f_, model_, test_, s_.limit_eval);
    }
    f_.print("epoch ", epoch_ + 1, " test accuracy ", accuracy_);
    f_.log_dict({{"test/accuracy", accuracy_}, {"epoch", static_cast<double>(epoch_ + 1)}}, step_);
    f_.call("on_validation_end", step_,
            {{"test/accuracy", accuracy_}, {"epoch", static_cast<double>(epoch_ + 1)}});
    if (s_.plateau) {
      // Every rank reports the same (all-reduced) value; metrics.csv shows what was reported.
      double monitored = accuracy_;
      if (s_.report_train_loss) {
        const double steps = static_cast<double>(std::max<int64_t>(steps_since_report_, 1));
        monitored = (loss_since_report_ / steps).item<double>();
        loss_since_report_.zero_();
        steps_since_report_ = 0;
      }
      scheduler_.report(monitored);
      f_.log_dict({{"scheduler/monitored", monitored}}, step_);
    }
    window_start_ += Clock::now() - eval_start;  // keep evaluation out of the img/s window
  }

  // The last checkpoint: this step's on SIGTERM, the final one (and the EMA weights beside the
  // exported ones), or, after non-finite values, one set aside.
  void end_training() {
    f_.call("on_fit_end", step_);
    if (signalled_) {
      const std::filesystem::path saved = checkpoints_->save();
      f_.print(stopped_, "; the state is in ", saved.empty() ? "(not saved)" : saved.string(),
               " (checkpoint.resume=auto continues from it)");
    } else if (stopped_.empty()) {
      checkpoints_->finish();
      examples::export_ema_weights(f_, model_.module, ema_.get(), checkpoints_->export_weights());
    } else {
      nonfinite_checkpoint_ = checkpoints_->save_aside("nonfinite").string();
      f_.print("stopped: ", stopped_, "; the state is in ", nonfinite_checkpoint_,
               " (never resumed from automatically); lower optimizer.lr, clip gradients "
               "(trainer.gradient_clip_val) or check the data");
    }
  }

  nlohmann::json summary() const {
    const double wall = std::chrono::duration<double>(Clock::now() - start_).count();
    const auto run_rates = throughput_->rates(static_cast<double>(images_), train_seconds_);
    const auto* scaler = f_.precision().scaler();
    return {
        {"name", task_.name},
        {"config_hash", c_.hash()},
        {"strategy", f_.strategy().name()},
        {"precision", fabric::to_string(f_.precision().mode())},
        {"device", f_.device().str()},
        {"world_size", f_.world_size()},
        {"threads", at::get_num_threads()},
        {"data", task_.data_kind},
        {"epochs", epoch_},
        {"steps", step_},
        {"train_loss", last_loss_},
        {"test_accuracy", accuracy_},
        {"images_per_second", run_rates.job},
        {"images_per_second_per_rank", run_rates.per_rank},
        {"flops_per_sample", throughput_->flops_per_unit()},
        {"flops_source", throughput_->flops_source()},
        {"tflops", null_if_negative(run_rates.tflops)},
        {"mfu", null_if_negative(run_rates.mfu)},
        {"wall_seconds", wall},
        {"batch_size", batch_size_},
        {"batch_size_search", batch_size_search()},
        {"peak_tensor_bytes", peak_tensor_bytes_ >= 0
                                  ? nlohmann::json(static_cast<int64_t>(peak_tensor_bytes_))
                                  : nlohmann::json(nullptr)},
        {"ema_decay", c_.get_double("trainer.ema_decay")},
        {"skipped_steps", scaler ? scaler->skipped_steps() : 0},
        {"run_dir", run_.path().string()},
        {"resumed_from", checkpoints_->resumed_from()},
        {"restart_attempt", checkpoints_->restart_attempt()},
        {"checkpoint_dir", checkpoints_->dir().string()},
        {"stopped", stopped_},
        {"stopped_early",
         f_.stop_reason().empty() ? nlohmann::json(nullptr) : nlohmann::json(f_.stop_reason())},
        {"nonfinite_checkpoint", nonfinite_checkpoint_},
    };
  }

  // data.batch_size: auto's trials, [[size, fits], ...] (null when the size was given).
  nlohmann::json batch_size_search() const {
    if (batch_size_trials_.empty()) return nullptr;
    nlohmann::json out = nlohmann::json::array();
    for (const auto& t : batch_size_trials_) out.push_back({t.batch_size, t.fits});
    return out;
  }

  fabric::Fabric& f_;
  const ClassifierModel& model_;
  const ClassificationTask& task_;
  const fabric::Config& c_;
  const Clock::time_point start_ = Clock::now();
  const fabric::RunDirectory run_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<fabric::ExponentialMovingAverage> ema_;
  std::vector<fabric::Fabric::BatchSizeTrial> batch_size_trials_;  // data.batch_size: auto's
  double peak_tensor_bytes_ = -1;  // max over ranks; -1: not counted
  int64_t batch_size_;
  fabric::DataLoader train_, test_;
  LoopSettings s_;  // total_steps: from where a resume stands (steps_after_resume)
  fabric::LRScheduler scheduler_;
  fabric::CheckpointState state_;
  torch::Tensor loss_since_report_;
  int64_t steps_since_report_ = 0;
  std::optional<fabric::Checkpointer> checkpoints_;
  int64_t step_ = 0, epoch_ = 0, images_ = 0;
  double train_seconds_ = 0, last_loss_ = NAN, accuracy_ = NAN;
  torch::Tensor window_loss_;
  int64_t window_ = 0, window_images_ = 0;
  Clock::time_point window_start_;
  std::optional<fabric::Throughput> throughput_;
  fabric::ProgressBar* bar_ = nullptr;
  std::optional<fabric::NonFiniteGuard> nonfinite_;
  std::optional<fabric::StopSignal> stop_signal_;
  bool signalled_ = false;
  std::optional<fabric::GraphedStep> train_step_;
  std::string stopped_, nonfinite_checkpoint_;
};

}  // namespace

double evaluate(fabric::Fabric& f, const ClassifierModel& model, fabric::DataLoader& loader,
                int64_t limit_batches) {
  torch::NoGradGuard no_grad;
  model.module.eval();
  auto correct = torch::zeros({}, torch::dtype(torch::kLong).device(f.device()));
  auto seen = torch::zeros({}, torch::dtype(torch::kLong).device(f.device()));
  int64_t b = 0;
  for (fabric::Batch& batch : loader) {
    if (limit_batches >= 0 && b++ >= limit_batches) break;
    torch::Tensor logits;
    {
      auto guard = f.autocast();
      logits = model.forward(f.precision().convert_input(batch.data));
    }
    // Padded duplicates (the distributed sampler evens out the ranks) are left out, so the
    // accuracy equals the single-process one exactly.
    correct += batch.unpadded(logits.argmax(1)).eq(batch.unpadded(batch.target)).sum();
    seen += batch.size() - batch.padding;
  }
  model.module.train();
  correct = f.all_reduce(correct, fabric::ReduceOp::kSum);
  seen = f.all_reduce(seen, fabric::ReduceOp::kSum);
  const int64_t n = seen.item<int64_t>();
  return n == 0 ? 0.0 : static_cast<double>(correct.item<int64_t>()) / static_cast<double>(n);
}

int train_classifier(fabric::Fabric& f, const ClassifierModel& model,
                     const ClassificationTask& task) {
  // Early stopping and the plateau schedule must be able to act: ConfigErrors before training.
  check_evaluation_keys(
      f.config(),
      {"trainer.eval_every_n_epochs", {"test/accuracy", "epoch"}, {"test/accuracy", "train/loss"}});
  if (f.config().get_string("checkpoint.export_format") == "hf")
    throw f.config().error_at("checkpoint.export_format",
                              "hf writes Hugging Face language models (examples:gpt); an image "
                              "classifier exports pt or safetensors");
  return ClassifierLoop(f, model, task).run();
}

}  // namespace examples
