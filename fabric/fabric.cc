#include "fabric/fabric.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/paths.h"
#include "fabric/logging/metrics_csv.h"
#include "fabric/logging/progress.h"
#include "fabric/logging/tensorboard.h"
#include "fabric/training/clip.h"

namespace fabric {

Fabric::Fabric(const Config& config) : Fabric(config, MachineFacts::query()) {}

Fabric::Fabric(const Config& config, const MachineFacts& facts)
    : config_(config), setup_(resolve_setup(config, facts)), strategy_(build_strategy(setup_)) {
  apply_global_settings(setup_);
  if (is_global_zero())
    for (const auto& w : setup_.warnings) std::cerr << "warning: " << w << std::endl;
}

Fabric::~Fabric() = default;

std::string Fabric::threads_description() const {
  const int64_t n = setup_.num_threads > 0 ? setup_.num_threads : at::get_num_threads();
  return std::to_string(n) + (n == 1 ? " thread" : " threads") + " per process (" +
         (setup_.num_threads > 0 ? setup_.threads_reason : "LibTorch's default") + ")";
}

int Fabric::run_launched(const std::function<int(Fabric&)>& fn) {
  strategy_->setup_environment();
  seed_everything(setup_.seed);
  int status = 0;
  try {
    status = fn(*this);
    if (metrics_) metrics_->flush();
  } catch (...) {
    strategy_->teardown_after_error();  // other ranks may never reach the teardown barrier
    throw;
  }
  strategy_->teardown();
  return status;
}

void Fabric::setup_module(torch::nn::Module& module) {
  if (setup_.channels_last) {
    // Before the strategy sees the module: moves and dtype casts keep the memory format, and
    // DDP's buckets follow the parameters' layout from the start.
    torch::NoGradGuard no_grad;
    for (auto& p : module.parameters())
      if (p.dim() == 4) p.set_data(p.data().contiguous(at::MemoryFormat::ChannelsLast));
  }
  strategy_->setup_module(module);
}

void Fabric::setup_optimizer(torch::optim::Optimizer& optimizer) {
  strategy_->setup_optimizer(optimizer);
}

DataLoader Fabric::setup_dataloader(std::shared_ptr<const Dataset> dataset,
                                    DataLoaderOptions options) {
  if (!options.seed()) options.seed(setup_.seed);
  LoaderPlacement placement;
  placement.num_replicas = world_size();
  placement.rank = global_rank();
  placement.device = device();
  placement.channels_last = setup_.channels_last;
  placement.cudnn_benchmark = setup_.cudnn_benchmark && placement.device.is_cuda();
  return DataLoader(std::move(dataset), std::move(options), placement);
}

void Fabric::backward(const torch::Tensor& loss) { strategy_->backward(loss); }

bool Fabric::step(torch::optim::Optimizer& optimizer) {
  return strategy_->optimizer_step(optimizer);
}

double Fabric::clip_gradients_norm(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                   double max_norm, double norm_type) {
  precision().unscale_gradients(optimizer);
  return clip_grad_norm_on_device(module.parameters(), max_norm, norm_type).item<double>();
}

void Fabric::clip_gradients_by_value(torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                     double clip_value) {
  precision().unscale_gradients(optimizer);
  torch::nn::utils::clip_grad_value_(module.parameters(), clip_value);
}

AutocastGuard Fabric::autocast() const { return strategy_->precision().autocast(); }

void Fabric::save_weights_of(torch::nn::Module& module, const std::string& path) {
  const auto file = absolute_from_working_directory(path);
  std::string failure;
  if (is_global_zero()) {
    try {
      save_state_dict(file, state_dict(module));
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  // Every rank learns whether rank 0 succeeded (no rank waits forever for a failed writer).
  failure = broadcast(failure, 0);
  if (!failure.empty()) throw Error(failure);
}

void Fabric::load_weights_of(torch::nn::Module& module, const std::string& path) {
  const auto file = absolute_from_working_directory(path);
  load_state_dict(module, load_state_dict_file(file), file.string());
}

RunDirectory Fabric::create_run_directory(const std::string& name) {
  auto run = RunDirectory::create(config_, name, global_rank(), world_size(),
                                  [this](const std::string& path) { return broadcast(path, 0); });
  has_run_directory_ = true;
  metrics_.reset();
  tensorboard_.reset();
  const auto loggers = config_.get_string_list("logging.loggers");
  auto wanted = [&](const char* name) {
    return is_global_zero() && std::find(loggers.begin(), loggers.end(), name) != loggers.end();
  };
  if (wanted("csv")) metrics_ = std::make_unique<CsvMetrics>(run.path() / "metrics.csv");
  if (wanted("tensorboard")) tensorboard_ = std::make_unique<TensorBoardScalars>(run.path());
  return run;
}

void Fabric::log(const std::string& name, double value, int64_t step) {
  log_dict({{name, value}}, step);
}

void Fabric::log(const std::string& name, const torch::Tensor& value, int64_t step) {
  if (is_global_zero()) log_dict({{name, value.item<double>()}}, step);
}

void Fabric::log_dict(const std::map<std::string, double>& values, int64_t step) {
  if (!is_global_zero()) return;
  if (!has_run_directory_)
    throw Error(
        "Fabric::log: no run directory yet; call create_run_directory(name) first "
        "(metrics go to <run dir>/metrics.csv)");
  if (metrics_) metrics_->log(values, step);
  if (tensorboard_) tensorboard_->log(values, step);
}

void Fabric::print_line(const std::string& line) const {
  if (progress_) {
    progress_->print_line(line);
  } else {
    std::cout << line << std::endl;
  }
}

ProgressBar& Fabric::progress_bar(int64_t total_steps, int64_t max_epochs, int64_t start_step) {
  static std::ostream discard(nullptr);  // ranks other than 0
  ProgressBar::Options options;
  options.total_steps = total_steps;
  options.max_epochs = max_epochs;
  options.start_step = start_step;
  options.log_every = config_.get_int("logging.log_every_n_steps");
  options.in_place =
      is_global_zero() && ProgressBar::in_place_for(config_.get_string("logging.progress_bar"));
  progress_.reset();
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
  if (world_size() == 1) return bytes;
  auto size = strategy_->broadcast(torch::tensor(static_cast<int64_t>(bytes.size())), src);
  auto buffer = torch::empty({size.item<int64_t>()}, torch::kUInt8);
  if (global_rank() == src) std::memcpy(buffer.data_ptr(), bytes.data(), bytes.size());
  buffer = strategy_->broadcast(buffer, src);
  return std::string(static_cast<const char*>(buffer.data_ptr()),
                     static_cast<size_t>(buffer.numel()));
}

std::vector<torch::Tensor> Fabric::all_gather(const torch::Tensor& tensor) {
  if (world_size() == 1) return {tensor};
  if (tensor.dim() == 0) return strategy_->all_gather(tensor);
  // Shapes first (dimension count padded to 8 + dtype), then the data padded to the longest.
  constexpr int64_t kMaxDims = 8;
  if (tensor.dim() > kMaxDims) throw Error("all_gather: at most 8 dimensions are supported");
  auto shape = torch::full({kMaxDims + 2}, -1, torch::kLong);
  shape[0] = static_cast<int64_t>(tensor.scalar_type());
  shape[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) shape[d + 2] = tensor.size(d);
  const auto shapes = strategy_->all_gather(shape.to(device()));
  int64_t longest = 0;
  for (size_t r = 0; r < shapes.size(); ++r) {
    const auto theirs = shapes[r].cpu();
    if (!torch::equal(theirs.narrow(0, 0, 2), shape.narrow(0, 0, 2)) ||
        !torch::equal(theirs.narrow(0, 3, kMaxDims - 1), shape.narrow(0, 3, kMaxDims - 1))) {
      throw Error("all_gather: rank " + std::to_string(global_rank()) + " and rank " +
                  std::to_string(r) +
                  " disagree on dtype or on a dimension other than the first; only the first "
                  "dimension may differ between ranks");
    }
    longest = std::max(longest, theirs[2].item<int64_t>());
  }
  torch::Tensor padded = tensor;
  if (tensor.size(0) < longest) {
    auto pad_shape = tensor.sizes().vec();
    pad_shape[0] = longest - tensor.size(0);
    padded = torch::cat({tensor, torch::zeros(pad_shape, tensor.options())});
  }
  auto gathered = strategy_->all_gather(padded);
  for (size_t r = 0; r < gathered.size(); ++r)
    gathered[r] = gathered[r].narrow(0, 0, shapes[r][2].item<int64_t>());
  return gathered;
}

}  // namespace fabric
