#include "fabric/fabric.h"

#include <torch/types.h>

#include <sys/resource.h>

#include <errno.h>  // program_invocation_short_name

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fabric/connector.h"
#include "fabric/core/paths.h"
#include "fabric/distributed/restart_agent.h"
#include "fabric/logging/loggers.h"
#include "fabric/logging/progress.h"
#include "fabric/main.h"
#include "fabric/nn/fp8.h"
#include "strategies/collectives.h"

namespace fabric {

Fabric::Fabric(const Config& config) : Fabric(config, MachineFacts::query()) {}

Fabric::Fabric(const Config& config, const MachineFacts& facts)
    : config_(config),
      setup_(std::make_unique<const ResolvedSetup>(resolve_setup(config, facts))),
      strategy_(build_strategy(*setup_)),
      loggers_(std::make_unique<Loggers>()) {
  apply_global_settings(*setup_);
  if (is_global_zero() && !setup_->restart_agent)  // the agent's rank 0 prints them
    for (const auto& w : setup_->warnings) std::cerr << "warning: " << w << std::endl;
}

Fabric::~Fabric() = default;

std::string Fabric::threads_description() const {
  const int64_t n = setup_->num_threads > 0 ? setup_->num_threads : at::get_num_threads();
  return std::to_string(n) + (n == 1 ? " thread" : " threads") + " per process (" +
         (setup_->num_threads > 0 ? setup_->threads_reason : "LibTorch's default") + ")";
}

int Fabric::run_launched(const std::function<int(Fabric&)>& fn) {
  if (setup_->restart_agent) {
    // This process supervises the job: every rank, 0 included, runs `fn` in a child.
    RestartAgentOptions agent;
    agent.world_size = world_size();
    agent.max_restarts = setup_->max_restarts;
    agent.backoff = setup_->restart_backoff;
    agent.store_timeout = setup_->ddp.timeout;
    return run_restart_agent(agent);
  }
  strategy_->setup_environment();
  seed_everything(setup_->seed);
  const auto start = std::chrono::steady_clock::now();
  int status = 0;
  try {
    status = fn(*this);
    status = report_unread_keys(status);
    loggers_->flush();
    write_default_summary(
        status, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } catch (const std::exception& e) {
    set_error_site(error_site(e));
    for (const auto& callback : callbacks_) {
      try {
        callback->on_exception(*this, e);
      } catch (...) {  // the first error is the one to report
      }
    }
    strategy_->teardown_after_error();
    throw;
  } catch (...) {
    strategy_->teardown_after_error();  // other ranks may never reach the teardown barrier
    throw;
  }
  strategy_->teardown();
  return status;
}

void Fabric::add_callback(std::shared_ptr<Callback> callback) {
  if (!callback) throw Error("add_callback: null callback");
  for (const auto& c : callbacks_)
    if (c->name() == callback->name())
      throw Error("add_callback: a callback named '" + callback->name() + "' was already added");
  callbacks_.push_back(std::move(callback));
}

void Fabric::call(const std::string& hook, int64_t step, const Metrics& values) {
  for (const auto& c : callbacks_) {
    if (hook == "on_fit_start") {
      c->on_fit_start(*this);
    } else if (hook == "on_fit_end") {
      c->on_fit_end(*this);
    } else if (hook == "on_train_batch_end") {
      c->on_train_batch_end(*this, step, values);
    } else if (hook == "on_validation_end") {
      c->on_validation_end(*this, step, values);
    } else {
      c->on_event(*this, hook, step, values);
    }
  }
}

bool Fabric::should_stop() {
  std::string reason;
  if (is_global_zero())
    for (const auto& c : callbacks_)
      if (reason = c->stop_reason(); !reason.empty()) break;
  reason = broadcast(reason, 0);
  if (!reason.empty()) stop_reason_ = reason;
  return !reason.empty();
}

void Fabric::setup_module(torch::nn::Module& module) {
  // The strategy may write the weights (a broadcast of rank 0's, a load): no float8 cast kept
  // from before survives (fabric/nn/fp8.h).
  const ScopeGuard casts([] { fabric::nn::release_fp8_weights(); });
  phase_ = Phase::kSetup;
  if (setup_->channels_last) {
    // Before the strategy sees the module: moves and dtype casts keep the memory format, and
    // DDP's buckets follow the parameters' layout from the start.
    torch::NoGradGuard no_grad;
    for (auto& p : module.parameters())
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
  // The empty init that made this module's tensors, if any (init_module).
  for (auto it = pending_inits_.begin(); it != pending_inits_.end(); ++it) {
    bool made = false;
    for (const auto& p : module.parameters()) made = made || (*it)->made(p);
    for (const auto& b : module.buffers()) made = made || (*it)->made(b);
    if (!made) continue;
    strategy_->set_empty_init(*it);
    pending_inits_.erase(it);
    break;
  }
  strategy_->setup_module(module);
  apply_init_weights(module);
  phase_ = Phase::kForward;
  if (precision().mode() == PrecisionMode::kFp8Mixed && is_global_zero()) {
    const auto& c = strategy_->fp8_conversion();
    auto some = [](const std::vector<std::string>& names) {
      std::string s;
      for (size_t i = 0; i < names.size() && i < 3; ++i) s += (i ? ", " : "") + names[i];
      return names.size() > 3 ? s + ", ..." : s;
    };
    std::string kept;
    if (!c.excluded.empty()) kept += "; excluded (fabric.fp8.exclude_modules): " + some(c.excluded);
    if (!c.unfit.empty()) kept += "; features not a multiple of 16: " + some(c.unfit);
    if (!c.plain.empty()) kept += "; torch::nn::Linear: " + some(c.plain);
    print_line("fp8-mixed: " + std::to_string(c.converted.size()) +
               " Linear layers run their GEMMs in float8" +
               (kept.empty() ? std::string() : ", bf16 kept" + kept));
  }
}

bool Fabric::empty_init_default() const { return setup_->empty_init; }

void Fabric::empty_init_failed(const c10::Error& e) const {
  const std::string what = e.what_without_backtrace();
  throw Error("init_module: the model's constructor failed on the meta device of an empty init (" +
              what.substr(0, what.find('\n')) +
              "); a constructor that reads values or moves tensors cannot run without memory: "
              "set fabric.empty_init: false, or make those tensors with a device");
}

void Fabric::setup_optimizer(torch::optim::Optimizer& optimizer) {
  phase_ = Phase::kSetup;
  strategy_->setup_optimizer(optimizer);
  phase_ = Phase::kForward;
}

DataLoader Fabric::setup_dataloader(std::shared_ptr<const Dataset> dataset,
                                    DataLoaderOptions options) {
  if (!options.seed()) options.seed(setup_->seed);
  // Loader threads beyond a few per CPU add memory (each holds batches in flight), not speed: at
  // most max(8, 4 per CPU of this process). The batches do not depend on the thread count.
  const int64_t cpus = std::max<int64_t>(setup_->num_threads, 1);
  const int64_t most = std::max<int64_t>(8, 4 * cpus);
  if (options.num_workers() > most) {
    print("warning: data.num_workers: ", options.num_workers(), " loader threads for ", cpus,
          " CPU(s) per process; using ", most,
          " (at most max(8, 4 per CPU): more only add memory)");
    options.num_workers(most);
  }
  LoaderPlacement placement;
  placement.num_replicas = strategy_->data_parallel_size();
  placement.rank = strategy_->data_parallel_rank();
  placement.device = device();
  placement.channels_last = setup_->channels_last;
  placement.cudnn_benchmark = setup_->cudnn_benchmark && placement.device.is_cuda();
  return DataLoader(std::move(dataset), std::move(options), placement);
}

void Fabric::backward(const torch::Tensor& loss) {
  phase_ = Phase::kBackward;
  strategy_->backward(loss);
  phase_ = Phase::kAfterBackward;
}

void Fabric::backward(const torch::Tensor& loss, MicroBatch micro) {
  if (micro.count < 1 || micro.index < 0 || micro.index >= micro.count) {
    throw Error("Fabric::backward: micro-batch " + std::to_string(micro.index) + " of " +
                std::to_string(micro.count) + " is outside [0, count)");
  }
  const ScopeGuard no_sync = micro.last() ? ScopeGuard() : strategy_->no_backward_sync();
  phase_ = Phase::kBackward;
  strategy_->backward(micro.count == 1 ? loss : loss / static_cast<double>(micro.count));
  phase_ = Phase::kAfterBackward;
}

namespace {

// fabric.sync_before_step: gradients of backward passes that all ran inside no_backward_sync are
// synchronized before a clip or step (false: each rank keeps its own, e.g. for local SGD).
void sync_before_step(const Config& config, Strategy& strategy) {
  if (config.get_bool("fabric.sync_before_step")) strategy.sync_unsynced_gradients();
}

}  // namespace

bool Fabric::step(torch::optim::Optimizer& optimizer) {
  phase_ = Phase::kStep;
  // The float8 weight casts kept for the micro-batches (fabric/nn/fp8.h) go before the optimizer
  // allocates, and again after it wrote the weights (a sharded optimizer's gather writes them
  // without an in-place op).
  fabric::nn::release_fp8_weights();
  sync_before_step(config_, *strategy_);  // before a clip measures them
  clip_for_config(optimizer);
  const bool stepped = strategy_->optimizer_step(optimizer);
  fabric::nn::release_fp8_weights();
  ++steps_;
  phase_ = Phase::kForward;
  if (setup_->memory_limit_gb > 0) {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const double peak_gb = static_cast<double>(usage.ru_maxrss) / (1024.0 * 1024.0);  // KiB
    if (peak_gb > setup_->memory_limit_gb) {
      char text[256];
      std::snprintf(text, sizeof(text),
                    "fabric.memory_limit_gb: rank %lld reached %.2f GiB of resident host memory "
                    "by optimizer step %lld, over the limit of %.2f GiB",
                    static_cast<long long>(global_rank()), peak_gb, static_cast<long long>(steps_),
                    setup_->memory_limit_gb);
      throw Error(std::string(text) +
                  "; shard the model over the ranks (fabric.strategy: fsdp, or "
                  "fabric.ddp.shard_optimizer_state), use a smaller batch, or raise the limit");
    }
  }
  return stepped;
}

double Fabric::clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                   double max_norm, double norm_type) {
  clipped_since_step_ = true;
  sync_before_step(config_, *strategy_);
  precision().unscale_gradients(optimizer);
  return strategy_->clip_gradients_norm(module.parameters(), optimizer, max_norm, norm_type)
      .item<double>();
}

void Fabric::clip_gradients_by_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                     double clip_value) {
  clipped_since_step_ = true;
  sync_before_step(config_, *strategy_);
  precision().unscale_gradients(optimizer);
  strategy_->clip_gradients_value(module.parameters(), optimizer, clip_value);
}

AutocastGuard Fabric::autocast() const { return strategy_->precision().autocast(); }

RunDirectory Fabric::create_run_directory(const std::string& name) {
  auto run = RunDirectory::create(config_, name, global_rank(), world_size(),
                                  [this](const std::string& path) { return broadcast(path, 0); });
  run_ = run;
  run_name_ = name;
  loggers_->open_built_in(
      is_global_zero() ? config_.get_string_list("logging.loggers") : std::vector<std::string>{},
      run.path());
  return run;
}

std::string Fabric::run_name() const {
  return run_name_.empty() ? std::string(program_invocation_short_name) : run_name_;
}

const RunDirectory& Fabric::run_directory() {
  if (!run_) create_run_directory(run_name());
  return *run_;
}

void Fabric::write_default_summary(int status, double wall_seconds) {
  if (!run_ || !is_global_zero()) return;
  std::error_code ec;
  if (std::filesystem::exists(run_->path() / "summary.json", ec)) return;  // the program's own
  nlohmann::json summary = {
      {"name", run_name()},
      {"run_dir", run_->path().string()},
      {"strategy", strategy_->name()},
      {"precision", to_string(precision().mode())},
      {"device", device().str()},
      {"world_size", world_size()},
      {"steps", steps_},
      {"wall_seconds", wall_seconds},
      {"exit_status", status},
  };
  for (const auto& [name, value] : last_logged_) summary[name] = value;
  run_->write_summary(summary);
}

std::map<std::string, double> Fabric::evaluate(DataLoader& loader, const PerExample& per_example,
                                               int64_t limit_batches) {
  phase_ = Phase::kEvaluate;
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> sums;  // float64 on the device
  int64_t seen = 0, b = 0;
  for (Batch& batch : loader) {
    if (limit_batches >= 0 && b++ >= limit_batches) break;
    std::map<std::string, torch::Tensor> values;
    {
      auto guard = autocast();
      values = per_example(batch);
    }
    for (const auto& [name, v] : values) {
      if (!v.defined() || v.dim() == 0 || v.size(0) != batch.size())
        throw Error("Fabric::evaluate: '" + name + "' holds " +
                    (v.defined() ? std::to_string(v.dim() == 0 ? 1 : v.size(0)) : "no") +
                    " values for a batch of " + std::to_string(batch.size()) +
                    " examples; return one per example (e.g. a loss with reduction none)");
      torch::Tensor sum = batch.unpadded(v).to(torch::kDouble).sum();
      torch::Tensor& acc = sums[name];
      acc = acc.defined() ? acc + sum : sum;
    }
    seen += batch.size() - batch.padding;
  }
  // A pass left after limit_batches ends here, in the checkpointed state too: the next
  // evaluation, live or resumed, runs the next epoch from its start.
  loader.end_pass();
  std::vector<torch::Tensor> parts;
  for (const auto& [name, sum] : sums) parts.push_back(sum.to(device()).reshape({1}));
  parts.push_back(
      torch::full({1}, static_cast<double>(seen), torch::dtype(torch::kDouble).device(device())));
  const torch::Tensor total = all_reduce(torch::cat(parts), ReduceOp::kSum).cpu();
  const double count = total[total.size(0) - 1].item<double>();
  std::map<std::string, double> means;
  int64_t i = 0;
  for (const auto& [name, sum] : sums) {
    (void)sum;
    means[name] = count > 0 ? total[i++].item<double>() / count : 0.0;
  }
  means["examples"] = count;
  phase_ = Phase::kAfterEvaluate;
  return means;
}

void Fabric::log(const std::string& name, double value, int64_t step) {
  log_dict({{name, value}}, step);
}

void Fabric::log(const std::string& name, const torch::Tensor& value, int64_t step) {
  if (is_global_zero()) log_dict({{name, value.item<double>()}}, step);
}

void Fabric::log_dict(const std::map<std::string, double>& values, int64_t step) {
  if (!is_global_zero()) return;
  if (!run_)
    throw Error(
        "Fabric::log: no run directory yet; call f.run_directory() (or create_run_directory) on "
        "every rank first (metrics go to <run dir>/metrics.csv)");
  loggers_->log(values, step);
  for (const auto& [name, value] : values) last_logged_[name] = value;
}

void Fabric::add_logger(std::unique_ptr<MetricLogger> logger) { loggers_->add(std::move(logger)); }

void Fabric::print_line(const std::string& line) const {
  if (progress_) {
    progress_->print_line(line);
  } else {
    std::cout << line << std::endl;
  }
}

ProgressBar& Fabric::progress_bar(int64_t total_steps, int64_t max_epochs, int64_t start_step) {
  static std::ostream discard(nullptr);  // ranks other than 0
  const auto options =
      ProgressBar::Options()
          .total_steps(total_steps)
          .max_epochs(max_epochs)
          .start_step(start_step)
          .log_every(config_.get_int("logging.log_every_n_steps"))
          .in_place(is_global_zero() &&
                    ProgressBar::in_place_for(config_.get_string("logging.progress_bar")));
  // The previous bar is finished but kept: a reference the program still holds stays valid (it
  // was freed here: a use-after-free when used again).
  if (progress_) {
    progress_->finish();
    retired_progress_.push_back(std::move(progress_));
  }
  progress_ = std::make_unique<ProgressBar>(is_global_zero() ? std::cout : discard, options);
  return *progress_;
}

void Fabric::seed_everything(uint64_t seed) { torch::manual_seed(seed); }

torch::Tensor Fabric::to_device(const torch::Tensor& tensor) const {
  return tensor.defined() ? tensor.to(device(), /*non_blocking=*/true) : tensor;
}

Batch Fabric::to_device(const Batch& batch) const {
  Batch moved = batch;
  moved.data = to_device(batch.data);
  moved.target = to_device(batch.target);
  return moved;
}

torch::Tensor Fabric::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  return strategy_->all_reduce(tensor, op);
}

void Fabric::barrier() { strategy_->barrier(); }

torch::Tensor Fabric::broadcast(const torch::Tensor& tensor, int64_t src) {
  return strategy_->broadcast(tensor, src);
}

double Fabric::all_reduce(double value, ReduceOp op) {
  return strategy_->all_reduce(torch::tensor(value, torch::kDouble), op).item<double>();
}

std::string Fabric::broadcast(const std::string& bytes, int64_t src) {
  return broadcast_string(*strategy_, bytes, src);
}

std::vector<torch::Tensor> Fabric::all_gather(const torch::Tensor& tensor) {
  return all_gather_padded(*strategy_, tensor);
}

}  // namespace fabric
