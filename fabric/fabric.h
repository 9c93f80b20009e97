// Fabric++'s facade: fabric::Fabric, and what a training loop touches through it (Config, data
// loaders, precision, checkpoint state, run directory, loggers, collectives).
//
// fabric::Fabric hides process-group setup, device placement, distributed sampling and mixed
// precision so that one training loop runs unchanged on CPU, one GPU or N GPUs on N nodes; only
// the YAML config changes. Beside it, included separately: fabric/main.h (run_main: a main() with
// --config, overrides and exit statuses), fabric/checkpointer.h (periodic checkpoints, resume),
// fabric/nonfinite_guard.h, fabric/training/ (optimizers and schedules from the config, CUDA-graph
// steps), fabric/connector.h (how the config was resolved).
//
// Example (examples/fashion_mnist.cc is a complete program):
// clang-format off
//   #include "fabric/fabric.h"
//   #include "fabric/main.h"
//
//   int main(int argc, char** argv) {
//     return fabric::run_main(argc, argv, fabric::training_schema(),
//                             [](const fabric::Config& config) {
//       fabric::Fabric fabric(config);
//       return fabric.launch([&](fabric::Fabric& f) {
//         Net model;
//         torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
//         f.setup(model, optimizer);
//         auto train = f.setup_dataloader(dataset,
//                                         fabric::DataLoaderOptions().batch_size(256).shuffle(true));
//         for (int epoch = 0; epoch < 10; ++epoch)
//           for (fabric::Batch& batch : train) {
//             optimizer.zero_grad();
//             torch::Tensor loss;
//             {
//               auto guard = f.autocast();
//               loss = torch::cross_entropy_loss(model->forward(batch.data), batch.target);
//             }
//             f.backward(loss);
//             f.step(optimizer);
//           }
//       });
//     });
//   }
// clang-format on
//
// Thread-safety: a Fabric is used from the thread that runs launch().
#ifndef FABRIC_FABRIC_H_
#define FABRIC_FABRIC_H_

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "fabric/callback.h"
#include "fabric/checkpoint/checkpoint_state.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/config/config.h"
#include "fabric/core/error.h"
#include "fabric/data/data_loader.h"
#include "fabric/data/dataset.h"
#include "fabric/data/torch_dataset.h"
#include "fabric/logging/logger.h"
#include "fabric/logging/run_dir.h"
#include "fabric/nn/data_parallel.h"
#include "fabric/nn/empty_init.h"
#include "fabric/precision/precision.h"
#include "fabric/training/accumulation.h"
#include "strategies/strategy.h"

namespace fabric::distributed {
class PipelineRunner;       // fabric/distributed/pipeline_runtime.h
struct PipelineOptions;     // fabric/distributed/pipeline_runtime.h
struct PipelineStageCalls;  // fabric/distributed/pipeline_runtime.h
}  // namespace fabric::distributed

namespace fabric {

class Loggers;
class ProgressBar;
struct MachineFacts;   // fabric/connector.h
struct ResolvedSetup;  // fabric/connector.h

class Fabric {
 public:
  // Resolves `config` (fabric: section) with the Connector; throws ConfigError for impossible
  // requests. Prints the Connector's warnings once on global rank 0.
  explicit Fabric(const Config& config);
  // For tests and embedding: an explicit machine description.
  Fabric(const Config& config, const MachineFacts& facts);
  ~Fabric();

  // Runs `fn` in every process of the job (self-launching the other ranks when needed, see
  // connector.h): sets up the device and process group, seeds every RNG
  // with fabric.seed, calls fn(*this), tears down. Returns the exit status for main: 0, or what
  // `fn` returns when it returns an int (e.g. 3 when training stopped on a non-finite loss).
  template <typename Fn>
  int launch(Fn&& fn) {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn&, Fabric&>>) {
      return run_launched([&fn](Fabric& f) {
        fn(f);
        return 0;
      });
    } else {
      return run_launched([&fn](Fabric& f) { return static_cast<int>(fn(f)); });
    }
  }

  // Moves `module` to the device, converts it for the precision (*-true), prepares gradient
  // synchronization; the optimizers (built on the module's parameters before or after) are set up
  // for the strategy. Optimizers keep valid parameter references (parameters are moved in place).
  // The first module set up gets the weights of model.init_weights unless the program read that
  // key before (ConfigError naming it when they do not load).
  template <typename Module, typename... Optimizers>
  void setup(Module& module, Optimizers&... optimizers) {
    setup_module(module_ref(module));
    (setup_optimizer(optimizers), ...);
  }
  void setup_module(torch::nn::Module& module);
  void setup_optimizer(torch::optim::Optimizer& optimizer);

  // data.batch_size: auto (Accelerate's find_executable_batch_size, Lightning's batch-size
  // tuner): the largest batch per process that `trial(b)` runs without running out of memory
  // (c10::OutOfMemoryError: CUDA's, or on CPU fabric.tensor_memory_limit_gb's). Tries `start`,
  // then doubles while it fits, up to `most`; a first size that does not fit is halved until
  // one does. After a failure the device's cached memory is released before the next try. Every
  // rank runs the same trials and takes the same answer (a size fits when it fits on every
  // rank); `trial` must run no collective (run the backward under no_backward_sync), since a
  // rank that fails leaves the others. Throws fabric::Error when not even 1 fits. rank 0 prints
  // the trials.
  struct BatchSizeTrial {
    int64_t batch_size;
    bool fits;
  };
  int64_t find_batch_size(const std::function<void(int64_t)>& trial, int64_t start, int64_t most,
                          std::vector<BatchSizeTrial>* trials = nullptr);
  // The same with the training step as the trial: `loss(b)` (a batch of b examples through the
  // model and its loss; called under autocast) and its backward without gradient
  // synchronization, while a buffer the size of the optimizer's future state is held
  // (fabric::optimizer_state_bytes_expected); the gradients are dropped after each trial and
  // `module`'s buffers (BatchNorm statistics) put back after the search.
  int64_t find_batch_size(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                          const std::function<torch::Tensor(int64_t)>& loss, int64_t start,
                          int64_t most, std::vector<BatchSizeTrial>* trials = nullptr);

  // Builds a module with `make()` (a function returning it). With an empty init (`empty_init`,
  // or fabric.empty_init when not given) its parameters and buffers get no memory until
  // setup(), which gives them exactly the values `make()` gives with the same seed: whole on
  // the device, or under fsdp only this rank's shard of each, so a model larger than one
  // rank's memory can be set up (fabric/nn/empty_init.h says what a constructor may do). An
  // optimizer may be built on its parameters before setup.
  //     auto model = f.init_module([&] { return Gpt(config); });
  template <typename Make>
  auto init_module(Make&& make, std::optional<bool> empty_init = std::nullopt) {
    if (!empty_init.value_or(empty_init_default())) return make();
    auto scope = std::make_unique<EmptyInit>();
    try {
      auto module = make();
      std::shared_ptr<InitRecord> record = scope->record();
      scope.reset();  // the record is complete
      pending_inits_.push_back(std::move(record));
      return module;
    } catch (const c10::Error& e) {
      empty_init_failed(e);  // throws fabric::Error naming fabric.empty_init
    }
  }

  // A loader for this rank: sampler partitioned by rank, shuffled from fabric.seed (unless
  // options.seed() is set) + epoch, batches delivered on device(). See fabric/data/data_loader.h.
  DataLoader setup_dataloader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  template <typename D, std::enable_if_t<std::is_base_of_v<Dataset, std::decay_t<D>>, int> = 0>
  DataLoader setup_dataloader(D&& dataset, DataLoaderOptions options) {
    return setup_dataloader(std::make_shared<const std::decay_t<D>>(std::forward<D>(dataset)),
                            std::move(options));
  }
  // LibTorch's own datasets (torch::data::datasets::MNIST, TensorDataset, your Dataset<Self>,
  // .map()-ped through transforms): see fabric/data/torch_dataset.h.
  template <typename D, std::enable_if_t<!std::is_base_of_v<Dataset, std::decay_t<D>> &&
                                             torch_data::is_random_access<std::decay_t<D>>::value,
                                         int> = 0>
  DataLoader setup_dataloader(D&& dataset, DataLoaderOptions options) {
    return setup_dataloader(from_torch(std::forward<D>(dataset)), std::move(options));
  }

  // Evaluation in one call: runs `per_example` on each batch of `loader` (at most
  // `limit_batches`; -1: all) under torch::NoGradGuard and autocast(). It returns values per
  // example by name, each with the batch's size as first dimension, e.g.
  //   {{"loss", torch::cross_entropy_loss(logits, b.target, {}, at::Reduction::None)},
  //    {"accuracy", logits.argmax(1).eq(b.target)}}
  // The rows the distributed sampler pads with are dropped, the sums and the example count cross
  // the ranks in one all-reduce, and each name's mean over the examples is returned (every
  // example counted once: exactly a single process's value), the same on every rank, with
  // "examples" their count (means are 0 when it is 0). Every rank runs the same number of batches
  // (the sampler sees to it) and returns the same names. Collective. The pass ends with the call
  // (DataLoader::end_pass), also one stopped by the limit: the loader's state, and so a resumed
  // run, continue with the next epoch as the live run does.
  using PerExample = std::function<std::map<std::string, torch::Tensor>(const Batch&)>;
  std::map<std::string, double> evaluate(DataLoader& loader, const PerExample& per_example,
                                         int64_t limit_batches = -1);

  // loss.backward() with loss scaling (16-mixed) and gradient synchronization (DDP).
  void backward(const torch::Tensor& loss);
  // Gradient accumulation (fabric/training/accumulation.h): backward of loss / micro.count, with
  // the gradient synchronization skipped unless micro.last(). Throws fabric::Error for an index
  // outside [0, count).
  void backward(const torch::Tensor& loss, MicroBatch micro);
  // Optimizer step through the precision: under 16-mixed unscale (once), skip on inf/NaN and
  // update the scale. Returns whether the optimizer stepped; a fused optimizer
  // (fabric/training/fast_optimizers.h) decides on the device without waiting for it, and then
  // this returns true (the GradScaler's skipped_steps() counts its skips). With
  // fabric.memory_limit_gb, then throws fabric::Error naming the key when this process's peak
  // resident host memory exceeds it. With trainer.gradient_clip_val > 0 that the program never
  // read before its first step, it first clips the optimizer's gradients to it (by norm or by
  // value: trainer.gradient_clip_algorithm), unless clip_gradients* ran since the last step.
  bool step(torch::optim::Optimizer& optimizer);
  // Unscales (16-mixed) then clips the gradients of `module` to total norm `max_norm`; returns
  // the total norm before clipping.
  template <typename Module>
  double clip_gradients(Module& module, torch::optim::Optimizer& optimizer, double max_norm,
                        double norm_type = 2.0) {
    return clip_gradients_norm(module_ref(module), optimizer, max_norm, norm_type);
  }
  // Unscales (16-mixed) then clamps every gradient element to [-clip_value, clip_value].
  template <typename Module>
  void clip_gradients_value(Module& module, torch::optim::Optimizer& optimizer, double clip_value) {
    clip_gradients_by_value(module_ref(module), optimizer, clip_value);
  }

  // model->forward(input), except under fabric.strategy: dp with several GPUs, where the batch is
  // split over the devices and run on replicas (fabric/nn/data_parallel.h: autocast reaches them,
  // BatchNorm running statistics come back; the model must be a ModuleHolder of a
  // torch::nn::Cloneable). Use it in loops meant to run under dp.
  template <typename Holder>
  torch::Tensor forward(Holder& model, const torch::Tensor& input) {
    if (const auto* devices = strategy_->replica_devices(); devices && devices->size() > 1)
      return nn::data_parallel(model, input, *devices, device());
    return model->forward(input);
  }

  // Autocast region for *-mixed precisions (no-op otherwise); nesting-safe RAII.
  AutocastGuard autocast() const;
  // Skips gradient synchronization while the guard lives (a no-op with one process). The
  // strategy skips it for every module set up; `module` is for symmetry with Lightning's API. A
  // step after backward passes that all ran inside it averages their gradients first (ddp,
  // fsdp), as a synchronized last backward would have.
  template <typename Module>
  ScopeGuard no_backward_sync(Module& module) {
    (void)module;
    return strategy_->no_backward_sync();
  }

  // Pipeline parallelism (fabric.strategy: model_parallel with
  // fabric.model_parallel.pipeline_parallel_size > 1; docs/tensor_parallel.md). The size of the
  // pipeline (1 without one) and a runner's options from the fabric.pipeline.* keys (schedule,
  // micro-batches, virtual stages, this device; the caller adds the activations' sizes and dtype):
  //   distributed::PipelineOptions o = f.pipeline_options();
  //   o.activation_sizes = {B / o.micro_batches, T, C};
  //   distributed::PipelineRunner runner(f.strategy().pipeline_group(), o);
  //   GPTStages mine(whole, runner.local_stages(), runner.stages());  // before setup
  //   f.setup_pipeline_tied(mine->tied_weight(), runner);
  //   f.setup(mine, optimizer);
  //   loss = f.pipeline_backward(runner, calls, mine->tied_weight());  // then clip, step
  int64_t pipeline_parallel_size() const;
  distributed::PipelineOptions pipeline_options() const;
  // Before setup: a weight the first and the last stage both hold (a tied embedding) counts once
  // in the gradient norm (the first stage's copy).
  void setup_pipeline_tied(const torch::Tensor& weight, const distributed::PipelineRunner& runner);
  // One training step's forwards and backwards through the pipeline (runner.step, each forward
  // under autocast() and each backward through the precision), the gradients accumulated over
  // the micro-batches and synchronized once after the last; `tied` (defined where this rank
  // holds it): its gradient summed between the first and the last stage before that. Returns the
  // mean loss of the micro-batches (every rank of the pipeline). Then clip and step as usual.
  torch::Tensor pipeline_backward(distributed::PipelineRunner& runner,
                                  const distributed::PipelineStageCalls& calls,
                                  const torch::Tensor& tied = {});

  // This rank's part of each floating-point parameter of `module` after setup: each parameter
  // whole, or under fsdp the elements of it this rank holds (views the optimizer updates), with
  // what gathers them. What fabric::ExponentialMovingAverage averages, on any strategy.
  template <typename Module>
  ParameterParts parameter_parts(Module& module) {
    return strategy_->parameter_parts(module_ref(module));
  }

  // Model weights (parameters and buffers by name) to a file in PyTorch's serialization format,
  // written crash-safe by global rank 0; every rank returns once it is complete (or throws the
  // writer's error). Python reads it: torch.load(path, weights_only=True) → dict name → tensor.
  template <typename Module>
  void save_weights(Module& module, const std::string& path) {
    save_weights_of(module_ref(module), path);
  }
  // Loads weights saved by save_weights or by Python's torch.save(model.state_dict(), path) into
  // `module` on every rank, strictly (missing, unexpected or reshaped names → one error listing
  // them; nothing copied). See fabric/checkpoint/state_dict.h. The file's tensors go through
  // load_weights(module, tensors, path) below (a .safetensors file memory-mapped: after setup
  // each rank reads only its elements of it).
  template <typename Module>
  void load_weights(Module& module, const std::string& path) {
    load_weights_of(module_ref(module), path);
  }
  // Loads named tensors into `module` by name: `tensors` (name → tensor, e.g.
  // fabric::hf::read_weights(folder).tensors, views of memory-mapped safetensors files; any
  // floating dtype converted to the parameter's), `source` (a file or folder) naming them in
  // errors. Names and shapes are the module's logical (unsharded) ones. Strict: a missing,
  // unexpected or reshaped name → one fabric::Error line "SOURCE: does not match the model: ..."
  // naming the tensors, and nothing copied. After setup under fsdp, hsdp and model_parallel
  // (tensor parallel), each rank copies only the elements it keeps, straight from the given
  // tensors (of a memory-mapped file, only those pages are read), and the whole model is never
  // gathered (the strategy's ShardedState, fabric/checkpoint/sharded_state.h); ranks holding
  // whole parameters (single device, ddp, ZeRO-1) copy them whole. Before setup it copies into
  // the module as built; a module of an empty init (init_module) has no memory until setup and
  // is refused: load its weights after setup, and no rank ever holds the whole model. No
  // communication. docs/pretrained.md, "Memory per rank".
  //     auto model = f.init_module([&] { return fabric::models::Llama(config); });
  //     auto w = fabric::hf::read_weights(folder);                      // fabric/hf/weights.h
  //     auto kept = fabric::hf::checked_weights(*model, w, folder);     // whole shapes: now
  //     f.setup(model, *optimizer);
  //     f.load_weights(model, kept, folder);
  // `keep` (optional): names of the module's tensors that `tensors` may lack, which then keep the
  // values they have: a pretrained base loaded into a model with LoRA adapters the folder does
  // not hold, whose values are their init's (under an empty init the ones setup() gave them). A
  // name it keeps that `tensors` has is loaded. A strategy that splits parameters (fsdp,
  // model_parallel) still copies each rank's elements only, the kept tensors left as they are.
  //     f.load_weights(model, w.tensors, folder, fabric::nn::is_lora_tensor);
  using KeepName = CheckpointState::KeepName;
  template <typename Module>
  void load_weights(Module& module, const StateDict& tensors, const std::string& source,
                    const KeepName& keep = nullptr) {
    load_weights_of(module_ref(module), tensors, source, keep);
  }

  // Checkpoint: writes `state` (fabric/checkpoint/checkpoint_state.h) to `path` with,
  // automatically, every rank's random generator states (CPU and CUDA), the 16-mixed GradScaler,
  // the resolved config and its hash, the LibTorch version and the project revision. Global rank 0
  // writes, crash-safe (temporary file, fsync, rename, folder fsync); every rank returns once the
  // file is complete or throws the writer's one-line error ("cannot write PATH: ..."), leaving an
  // existing file at `path` untouched. Collective. The file is a torch.save archive of plain data
  // (Python's torch.load(path, weights_only=True) reads it).
  // checkpoint.format: sharded (the default, `auto`, under a strategy that splits parameters or
  // optimizer state over the ranks: fsdp, fabric.ddp.shard_optimizer_state) makes `path` a
  // folder instead, to which every rank writes its own pieces in parallel and nothing is
  // gathered (fabric/checkpoint/sharded.h); load() reads both forms at any world size.
  void save(const std::string& path, const CheckpointState& state);
  // save() in two parts, for writing in the background (the Checkpointer's checkpoint.async):
  // takes now, collectively, what save() would write (generator states gathered; full format:
  // split optimizer state gathered and modules whole; sharded: this rank's pieces) as a copy in
  // host memory, and returns what writes it on this rank: a function with no communication that
  // writes the file crash-safe (full: global rank 0, the others get an empty function; sharded:
  // every rank its part, rank 0 then completes the folder, fabric/checkpoint/writer.h).
  // `snapshot` (in and out): an earlier snapshot whose host tensors are reused where the shapes
  // match (no new allocation), replaced by this one (None on ranks that write nothing).
  // Collective.
  std::function<void()> snapshot_for_save(const std::string& path, const CheckpointState& state,
                                          std::shared_ptr<c10::IValue>& snapshot);
  // Whether save() writes sharded folders (checkpoint.format sharded, or auto under a strategy
  // that splits parameters or optimizer state) rather than one file.
  bool saves_sharded() const;
  // Restores `state` from a checkpoint on every rank: format version checked; config differences
  // warned about (one line listing the keys, checkpoint.* and logging.* ignored); every entry
  // checked before any is changed (strict: entries missing from the file or unknown to `state`
  // are errors; strict=false skips them with a warning); tensors land on the devices of the
  // objects they fill; this rank's random generator states restored (with a warning if the file
  // has none for this rank). Any problem on any rank → fabric::Error on every rank naming the file
  // and the problem. Collective.
  void load(const std::string& path, CheckpointState& state, bool strict = true);

  // The run directory for this job (logging.run_dir with {name} = `name`): created by global rank
  // 0, the same path on every rank; in a multi-process job ranks other than 0 send their stdout
  // and stderr to rank_N.log in it from here on (errors still reach the terminal). Collective.
  RunDirectory create_run_directory(const std::string& name);
  // This job's run directory: the one create_run_directory made, or else created now with
  // {name} = the program's file name (so the first call is collective: make it on every rank,
  // e.g. through fabric::Checkpointer(f, state)). When the function given to launch() returns,
  // global rank 0 writes summary.json into it unless the program wrote one (RunDirectory::
  // write_summary): the last value of every metric logged with log()/log_dict() (a sweep's
  // `metric:` is one of these names), and name, run_dir, strategy, precision, device,
  // world_size, steps (optimizer steps through step()), wall_seconds and exit_status.
  const RunDirectory& run_directory();
  // {name} of the run directory: create_run_directory's argument, else the program's file name.
  std::string run_name() const;

  // Metrics: `value` of `name` at `step` to the loggers of logging.loggers (csv: metrics.csv in
  // the run directory, fabric/logging/metrics_csv.h; tensorboard: an event file in the run
  // directory, fabric/logging/tensorboard.h), written by global rank 0 only (other ranks:
  // no-op; reduce values across ranks first with all_reduce if they differ). Throws fabric::Error
  // before create_run_directory() (on rank 0), or for a name that cannot be a column.
  void log(const std::string& name, double value, int64_t step);
  void log(const std::string& name, const torch::Tensor& value, int64_t step);  // 1 element
  void log_dict(const std::map<std::string, double>& values, int64_t step);
  // A logger of your own (fabric/logging/logger.h), called by log()/log_dict() on global rank 0
  // after the built-in ones, in the order added; kept across create_run_directory(). Other ranks
  // keep it without calling it. Its flush() runs when the function given to launch() returns.
  void add_logger(std::unique_ptr<MetricLogger> logger);

  // Callbacks (fabric/callback.h), called in the order added; fabric/callbacks.h makes the
  // built-in ones from the config. Throws fabric::Error for a name already added.
  void add_callback(std::shared_ptr<Callback> callback);
  const std::vector<std::shared_ptr<Callback>>& callbacks() const { return callbacks_; }
  // Fires `hook` on every callback, on this rank: "on_fit_start", "on_fit_end",
  // "on_train_batch_end" and "on_validation_end" reach those methods, any other name on_event.
  void call(const std::string& hook, int64_t step = 0, const Metrics& values = {});
  // Collective (call it on every rank at the same point of the loop): true on every rank when a
  // callback on global rank 0 asks to stop (Callback::stop_reason), which stop_reason() then
  // holds, so every rank leaves the loop at the same step.
  bool should_stop();
  const std::string& stop_reason() const { return stop_reason_; }

  // Seeds torch's CPU and CUDA generators (and thus dropout/init) with `seed`.
  void seed_everything(uint64_t seed);

  // Prints the arguments (streamed) and a newline on global rank 0 only (above the progress bar
  // when one is drawn in place).
  template <typename... Args>
  void print(Args&&... args) const {
    if (!is_global_zero()) return;
    std::ostringstream line;
    (line << ... << std::forward<Args>(args));
    print_line(line.str());
  }

  // The progress display of a training loop of `total_steps` optimizer steps over `max_epochs`
  // epochs (fabric/logging/progress.h), styled by logging.progress_bar (auto | true | false) and
  // logging.log_every_n_steps; `start_step` > 0 for a resumed run. Drawn by global rank 0 only
  // (on other ranks it draws nothing). Replaces the previous one (finished, and kept alive: a
  // reference to it stays valid). Call bar.step(step, epoch) after
  // every step and bar.set_metrics(loss, lr, images/s) when the logging window's values are known.
  ProgressBar& progress_bar(int64_t total_steps, int64_t max_epochs, int64_t start_step = 0);

  torch::Tensor to_device(const torch::Tensor& tensor) const;
  Batch to_device(const Batch& batch) const;

  // Collectives across the job (identity with one process). Every rank must call the same ones in
  // the same order; one that some rank never joins fails after fabric.ddp.timeout_s with an error
  // naming it ("all_reduce(sum) #3 (float32 [4]) did not complete: ...") instead of hanging;
  // fabric.ddp.debug_collectives checks that every rank issues the same ones.
  torch::Tensor all_reduce(const torch::Tensor& tensor, ReduceOp op = ReduceOp::kMean);
  double all_reduce(double value, ReduceOp op = ReduceOp::kMean);
  void barrier();
  torch::Tensor broadcast(const torch::Tensor& tensor, int64_t src = 0);
  // Rank `src`'s string (or bytes) on every rank, e.g. a run name or a serialized config.
  std::string broadcast(const std::string& bytes, int64_t src = 0);
  // Every rank's tensor, in rank order. First dimensions may differ between ranks (e.g. the
  // unpadded predictions of each rank's last batch); the other dimensions and the dtype must agree
  // (error naming the ranks otherwise). torch::cat(result) is the global tensor.
  std::vector<torch::Tensor> all_gather(const torch::Tensor& tensor);

  torch::Device device() const { return strategy_->root_device(); }
  int64_t global_rank() const { return strategy_->global_rank(); }
  int64_t local_rank() const { return strategy_->local_rank(); }
  int64_t node_rank() const { return strategy_->node_rank(); }
  int64_t world_size() const { return strategy_->world_size(); }
  // The ranks that read different data, and this rank's place among them: the world, except
  // under model_parallel, where each tensor-parallel group reads one share (world / tp of them).
  int64_t data_parallel_size() const { return strategy_->data_parallel_size(); }
  int64_t data_parallel_rank() const { return strategy_->data_parallel_rank(); }
  bool is_global_zero() const { return global_rank() == 0; }

  const Config& config() const { return config_; }
  // What the Connector resolved (fabric/connector.h: accelerator, devices, strategy, precision,
  // settings, threads).
  const ResolvedSetup& setup_info() const { return *setup_; }
  // The thread decision for start-up banners: "1 thread per process (auto: 2 CPUs / 2 processes
  // sharing them)", or "N threads per process (LibTorch's default)" when the CPUs are unknown.
  std::string threads_description() const;
  Strategy& strategy() { return *strategy_; }
  Precision& precision() { return strategy_->precision(); }

 private:
  static torch::nn::Module& module_ref(torch::nn::Module& m) { return m; }
  template <typename Impl>
  static torch::nn::Module& module_ref(torch::nn::ModuleHolder<Impl>& m) {
    return *m;
  }
  int run_launched(const std::function<int(Fabric&)>& fn);
  bool empty_init_default() const;
  [[noreturn]] void empty_init_failed(const c10::Error& e) const;
  // Gathers every rank's generator states and, under fabric.fp8.recipe: delayed, the amax
  // histories of `state`'s modules (collective); the returned function builds the file's
  // contents from the state it is given (no communication).
  std::function<c10::IValue(const CheckpointState&)> gather_for_save(const CheckpointState& state);
  bool delayed_fp8() const;  // fabric.precision fp8-mixed with fabric.fp8.recipe: delayed
  void print_line(const std::string& line) const;
  // Global rank 0, when launch's function returned `status`: summary.json unless one exists.
  void write_default_summary(int status, double wall_seconds);
  void save_weights_of(torch::nn::Module& module, const std::string& path);
  void load_weights_of(torch::nn::Module& module, const std::string& path);
  void load_weights_of(torch::nn::Module& module, const StateDict& tensors,
                       const std::string& source, const KeepName& keep = nullptr);
  double clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                             double max_norm, double norm_type);
  void clip_gradients_by_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                               double clip_value);
  // fabric_keys.cc: the keys a program leaves to Fabric, and the report of keys nothing read.
  void apply_init_weights(torch::nn::Module& module);        // model.init_weights, first setup
  void clip_for_config(torch::optim::Optimizer& optimizer);  // trainer.gradient_clip_val
  int report_unread_keys(int status);  // rank 0; returns 2 under fabric.strict_keys

  Config config_;
  std::unique_ptr<const ResolvedSetup> setup_;
  std::unique_ptr<Strategy> strategy_;
  // Built-in (rank 0, opened by create_run_directory from logging.loggers) and added loggers.
  std::unique_ptr<Loggers> loggers_;
  std::unique_ptr<ProgressBar> progress_;
  std::vector<std::unique_ptr<ProgressBar>> retired_progress_;  // earlier bars, finished
  std::optional<RunDirectory> run_;
  std::string run_name_;
  std::map<std::string, double> last_logged_;  // global rank 0: each metric's last value
  int64_t steps_ = 0;                          // optimizer steps through step(), for messages
  std::vector<std::shared_ptr<Callback>> callbacks_;
  std::vector<std::shared_ptr<InitRecord>> pending_inits_;  // init_module's, until setup
  std::string stop_reason_;
  // Where the loop is, for the line an error ends the program with (fabric/main.h
  // set_error_site): the Fabric call running, or the last one that returned.
  enum class Phase {
    kBeforeSetup,
    kSetup,
    kForward,
    kBackward,
    kAfterBackward,
    kStep,
    kEvaluate,
    kAfterEvaluate,
    kSave,
    kLoad
  };
  Phase phase_ = Phase::kBeforeSetup;
  // `phase` while it lives; the one before it again when it ends without an exception.
  class PhaseScope {
   public:
    PhaseScope(Fabric& f, Phase phase) : f_(f), before_(f.phase_) { f.phase_ = phase; }
    ~PhaseScope() {
      if (std::uncaught_exceptions() == 0) f_.phase_ = before_;
    }
    PhaseScope(const PhaseScope&) = delete;
    PhaseScope& operator=(const PhaseScope&) = delete;

   private:
    Fabric& f_;
    Phase before_;
  };
  std::string error_site(const std::exception& e) const;  // the phase, and a hint for `e`
  std::string phase_description() const;
  bool init_weights_decided_ = false;  // apply_init_weights ran (first setup_module)
  std::optional<double> config_clip_;  // decided at the first step: 0 when the program clips
  bool config_clip_by_value_ = false;  // trainer.gradient_clip_algorithm: value
  bool clipped_since_step_ = false;    // clip_gradients* ran since the last step
};

}  // namespace fabric

#endif  // FABRIC_FABRIC_H_
