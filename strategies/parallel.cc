#include "strategies/parallel.h"

#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <utility>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "strategies/optimizer_shard.h"

namespace fabric::strategies {

distributed::RendezvousOptions rendezvous_options(const DdpOptions& o,
                                                  std::vector<std::string> argv) {
  distributed::RendezvousOptions r;
  r.timeout = o.timeout;
  r.heartbeat_timeout = o.heartbeat_timeout;
  r.debug_collectives = o.debug_collectives;
  r.cuda_with_gloo = o.cuda_with_gloo;
  r.cpu_backend = o.cpu_backend;
  r.argv = std::move(argv);
  return r;
}

ParallelStrategy::ParallelStrategy(std::shared_ptr<ClusterEnvironment> environment,
                                   torch::Device device, std::unique_ptr<Precision> precision,
                                   distributed::RendezvousOptions options)
    : Strategy(std::move(precision)),
      env_(std::move(environment)),
      device_(device),
      options_(std::move(options)) {
  options_.cuda = device_.is_cuda();
  options_.cuda_device = device_.is_cuda() ? device_.index() : 0;
}

ParallelStrategy::~ParallelStrategy() = default;

void ParallelStrategy::setup_environment() {
  // A second launch would join a new rendezvous beside the ended one (self-launched ranks would
  // start again and wait on the old store until timeout_s): refused at once.
  if (rendezvous_)
    throw Error(
        "Fabric::launch: called a second time on this Fabric; a process joins its job once: run "
        "every phase (training, evaluation, ...) inside one launched function");
#ifdef FABRIC_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::set_device(device_.index());
#endif
  rendezvous_ = std::make_unique<distributed::Rendezvous>(env_, options_);
}

void ParallelStrategy::teardown() {
  release();
  if (rendezvous_) rendezvous_->finish();
}

void ParallelStrategy::teardown_after_error() {
  release();
  if (rendezvous_) rendezvous_->end_after_error();
}

const c10::intrusive_ptr<c10d::ProcessGroup>& ParallelStrategy::process_group() const {
  static const c10::intrusive_ptr<c10d::ProcessGroup> kNone;
  return rendezvous_ ? rendezvous_->process_group() : kNone;
}

const c10::intrusive_ptr<c10d::ProcessGroup>& ParallelStrategy::group_for(
    const std::string& what) const {
  if (!rendezvous_)
    throw Error(name() + ": " + what + " before launch (call it inside Fabric::launch)");
  return rendezvous_->process_group();
}

torch::Tensor ParallelStrategy::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
  static const char* const kOps[] = {"all_reduce(sum)", "all_reduce(mean)", "all_reduce(max)",
                                     "all_reduce(min)"};
  const char* kind = kOps[static_cast<int>(op)];
  const auto& pg = group_for(kind);
  std::vector<torch::Tensor> t = {tensor.clone()};
  c10d::AllreduceOptions o;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      o.reduceOp = c10d::ReduceOp::SUM;
      break;
    case ReduceOp::kMax:
      o.reduceOp = c10d::ReduceOp::MAX;
      break;
    case ReduceOp::kMin:
      o.reduceOp = c10d::ReduceOp::MIN;
      break;
  }
  distributed::wait(pg->allreduce(t, o), rendezvous_->begin_collective(kind, &tensor));
  if (op == ReduceOp::kMean) {
    return t[0].is_floating_point() ? t[0] / static_cast<double>(world_size())
                                    : t[0].div(world_size(), "floor");
  }
  return t[0];
}

void ParallelStrategy::barrier() {
  const auto& pg = group_for("barrier");
  distributed::wait(pg->barrier(), rendezvous_->begin_collective("barrier", nullptr));
}

torch::Tensor ParallelStrategy::broadcast(const torch::Tensor& tensor, int64_t src) {
  if (src < 0 || src >= world_size())
    throw Error("broadcast: src " + std::to_string(src) + " does not exist (world size " +
                std::to_string(world_size()) + ")");
  const std::string kind = "broadcast(from " + std::to_string(src) + ")";
  const auto& pg = group_for(kind);
  std::vector<torch::Tensor> t = {tensor.clone()};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  distributed::wait(pg->broadcast(t, o), rendezvous_->begin_collective(kind, &tensor));
  return t[0];
}

std::vector<torch::Tensor> ParallelStrategy::all_gather(const torch::Tensor& tensor) {
  const auto& pg = group_for("all_gather");
  return distributed::all_gather(*pg, tensor, rendezvous_->begin_collective("all_gather", &tensor));
}

OptimizerShard* ParallelStrategy::shard_of(const torch::optim::Optimizer& optimizer) const {
  return shard_ && &shard_->optimizer() == &optimizer ? shard_.get() : nullptr;
}

void ParallelStrategy::agree_on_found_inf() {
  GradScaler* scaler = precision_->scaler();
  if (scaler == nullptr) return;
  c10::intrusive_ptr<c10d::ProcessGroup> pg = process_group();
  scaler->set_found_inf_agreement([pg](torch::Tensor& found) {
    std::vector<torch::Tensor> v = {found};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d::ReduceOp::MAX;
    distributed::wait(pg->allreduce(v, o), "GradScaler found_inf all_reduce(max)");
  });
}

torch::Tensor ParallelStrategy::clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                                    torch::optim::Optimizer& optimizer,
                                                    double max_norm, double norm_type) {
  if (OptimizerShard* shard = shard_of(optimizer))
    return shard->clip_grad_norm(max_norm, norm_type);
  return Strategy::clip_gradients_norm(parameters, optimizer, max_norm, norm_type);
}

void ParallelStrategy::clip_gradients_value(const std::vector<torch::Tensor>& parameters,
                                            torch::optim::Optimizer& optimizer, double clip_value) {
  if (OptimizerShard* shard = shard_of(optimizer)) return shard->clip_grad_value(clip_value);
  Strategy::clip_gradients_value(parameters, optimizer, clip_value);
}

std::optional<c10::IValue> ParallelStrategy::gather_optimizer_state(
    torch::optim::Optimizer& optimizer) {
  if (OptimizerShard* shard = shard_of(optimizer)) return shard->full_state();
  return std::nullopt;
}

std::optional<c10::IValue> ParallelStrategy::local_optimizer_state(
    torch::optim::Optimizer& optimizer) {
  if (OptimizerShard* shard = shard_of(optimizer)) return shard->local_state();
  return std::nullopt;
}

std::optional<std::vector<std::vector<std::string>>> ParallelStrategy::optimizer_parameter_names(
    const torch::optim::Optimizer& optimizer) {
  if (OptimizerShard* shard = shard_of(optimizer)) return shard->names_by_group();
  return std::nullopt;
}

std::optional<PieceRange> ParallelStrategy::wanted_optimizer_piece(
    const torch::optim::Optimizer& optimizer, const std::string& path, at::IntArrayRef sizes,
    at::IntArrayRef strides, const std::optional<PieceLayout>& layout) {
  OptimizerShard* shard = shard_of(optimizer);
  if (shard == nullptr || layout) return std::nullopt;  // a layout: not this optimizer's order
  return shard->wanted(path, sizes, strides);
}

std::optional<std::function<void()>> ParallelStrategy::prepare_split_optimizer_state(
    torch::optim::Optimizer& optimizer, const c10::IValue& state, const std::string& source) {
  if (OptimizerShard* shard = shard_of(optimizer)) return shard->prepare_full_state(state, source);
  return std::nullopt;
}

std::vector<torch::Tensor> float8_as_bytes(std::vector<torch::Tensor> tensors) {
  for (auto& t : tensors)
    if (t.defined() && c10::isFloat8Type(t.scalar_type())) t = t.view(torch::kUInt8);
  return tensors;
}

}  // namespace fabric::strategies
