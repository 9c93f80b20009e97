#include "strategies/ddp.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/batch_norm.h"
#include "strategies/flat_gradient_sync.h"
#include "strategies/optimizer_shard.h"

namespace fabric::strategies {
namespace {

// Gradient compression for the wire: each bucket is all-reduced in bfloat16 (pre-divided by the
// world size, as the fp16 hook does) and written back in the bucket's dtype. Halves the bytes of
// fp32 gradients with fp32's exponent range (no overflow where fp16 would).
class Bf16CompressHook : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  explicit Bf16CompressHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : CppCommHookInterface(group) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor bucket_buffer = bucket.getBufferRef();
    std::vector<at::Tensor> wire = {bucket_buffer.to(torch::kBFloat16).div_(state_->getSize())};
    auto reduced = state_->allreduce(wire)->getFuture();
    return reduced->then(
        [bucket_buffer](c10::ivalue::Future& done) {
          bucket_buffer.copy_(done.value().toTensorVector()[0]);
          return c10::IValue(bucket_buffer);
        },
        reduced->elementType());
  }
};

// Identity on the loss whose backward, run first in the backward pass, queues the Reducer's
// delayed all-reduce for the end of that pass. static_graph needs it in its first iteration: the
// Reducer then only records which gradients arrive (PyTorch queues the same callback from its
// _DDPSink). The Reducer outlives the backward pass (Ddp owns it).
class StaticGraphFirstIterationSink
    : public torch::autograd::Function<StaticGraphFirstIterationSink> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& loss,
                               c10d::Reducer* reducer) {
    ctx->saved_data["reducer"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(reducer));
    return loss.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* reducer =
        reinterpret_cast<c10d::Reducer*>(static_cast<intptr_t>(ctx->saved_data["reducer"].toInt()));
    torch::autograd::Engine::get_default_engine().queue_callback(
        [reducer] { reducer->delay_all_reduce(); });
    return {grads[0], torch::Tensor()};
  }
};

}  // namespace

Ddp::Ddp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
         std::unique_ptr<Precision> precision, DdpOptions options, std::vector<std::string> argv)
    : ParallelStrategy(std::move(environment), device, std::move(precision),
                       rendezvous_options(options, std::move(argv))),
      options_(std::move(options)) {}

Ddp::~Ddp() = default;

void Ddp::release() {
  reducer_.reset();
  flat_sync_.reset();
  shard_.reset();
}

void Ddp::setup_module(torch::nn::Module& module) {
  const auto& pg = group_for("setup_module");
  if (!params_.empty())
    throw Error(
        "fabric.strategy: ddp synchronizes one module per process; this job set up a second one "
        "(its gradient sync would replace the first's): put the modules in one torch::nn::Module "
        "(e.g. a generator and a discriminator as its submodules) and set it up once");
  materialize_empty_init(module, device_);
  module.to(device_);
  convert_module(module);
  if (options_.sync_batchnorm) {
    // Before collecting parameters: swapped modules keep the same parameter tensors anyway.
    sync_batchnorm_modules_ =
        static_cast<int64_t>(nn::convert_sync_batchnorm_or_throw(module, pg).synchronized.size());
  }
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  buffers_.clear();
  for (const auto& b : module.buffers()) buffers_.push_back(b);
  if (params.empty()) throw Error("ddp: the module has no parameters that require gradients");

  // Same shapes everywhere, then rank 0's values everywhere.
  c10d::verify_params_across_processes(pg, params, std::nullopt);
  std::vector<torch::Tensor> state = params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  {
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(pg, state, 250 * 1024 * 1024, 0);
  }

  params_ = params;
  param_names_ = names;
  reducer_.reset();
  reducer_backwards_ = 0;
  if (options_.shard_optimizer_state) {  // the OptimizerShard synchronizes; made in setup_optimizer
    if (options_.find_unused_parameters)
      throw Error(
          "fabric.ddp.shard_optimizer_state: find_unused_parameters is not supported with it; "
          "set fabric.ddp.find_unused_parameters: false");
    if (options_.comm_hook != CommHook::kNone)
      throw Error(std::string("fabric.ddp.shard_optimizer_state: comm_hook ") +
                  comm_hook_name(options_.comm_hook) +
                  " is not supported with it; set fabric.ddp.comm_hook: none");
    return;
  }
  if (!capturable_) make_reducer();
  flat_sync_ = std::make_unique<FlatGradientSync>(params, std::move(names), pg, options_.comm_hook);
}

void Ddp::make_reducer() {
  const std::vector<torch::Tensor>& params = params_;
  const std::vector<std::string>& names = param_names_;
  // As torch.nn.parallel.DistributedDataParallel: one bucket in the first iteration unless
  // find_unused_parameters (then [1 MiB, cap]); the Reducer rebuilds buckets in backward order.
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb * 1024 * 1024);
  std::vector<size_t> limits;
  if (options_.static_graph || !options_.find_unused_parameters) {
    limits = {std::numeric_limits<size_t>::max()};
  } else {
    limits = {static_cast<size_t>(c10d::kDefaultFirstBucketBytes), static_cast<size_t>(cap)};
  }
  auto [indices, per_bucket_limits] = c10d::compute_bucket_assignment_by_size(params, limits);
  (void)per_bucket_limits;
  std::reverse(indices.begin(), indices.end());
  std::unordered_map<size_t, std::string> names_by_index;  // the Reducer's form, for its errors
  for (size_t i = 0; i < names.size(); ++i) names_by_index[i] = names[i];
  reducer_ = std::make_shared<c10d::Reducer>(
      params, indices, process_group(), std::vector<bool>(params.size(), false), cap,
      options_.find_unused_parameters, options_.gradient_as_bucket_view, names_by_index,
      c10d::kDefaultFirstBucketBytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  if (options_.static_graph) reducer_->set_static_graph();
  if (options_.comm_hook == CommHook::kFp16)
    reducer_->register_builtin_comm_hook(c10d::BuiltinCommHookType::FP16_COMPRESS);
  if (options_.comm_hook == CommHook::kBf16)
    reducer_->register_comm_hook(std::make_unique<Bf16CompressHook>(process_group()));
}

void Ddp::setup_optimizer(torch::optim::Optimizer& optimizer) {
  if (!options_.shard_optimizer_state) return;
  if (params_.empty())
    throw Error(
        "fabric.ddp.shard_optimizer_state: set up the module before its optimizer "
        "(Fabric::setup(model, optimizer) does)");
  if (shard_)
    throw Error(
        "fabric.ddp.shard_optimizer_state: supports one optimizer; this job set up a "
        "second one");
  shard_ = std::make_unique<OptimizerShard>(optimizer, params_, param_names_,
                                            group_for("setup_optimizer"));
  agree_on_found_inf();
}

void Ddp::set_capturable_gradient_sync(bool on) {
  if (on && options_.shard_optimizer_state)
    throw Error(
        "fabric.cuda_graphs: not supported with fabric.ddp.shard_optimizer_state; set "
        "one of them to false");
  capturable_ = on;
  // The Reducer keeps every parameter's AccumulateGrad node alive, and a node runs on the stream
  // it was made on (the default one at setup): a backward captured on a side stream would make
  // the default stream wait on the capture, which CUDA refuses ("operation would make the legacy
  // stream depend on a capturing blocking stream"). Without it, the nodes are made afresh on the
  // capturing stream, as PyTorch asks of DDP ("construct it in a side-stream context").
  if (on) {
    reducer_.reset();
  } else if (!reducer_ && flat_sync_) {  // set up and not torn down
    reducer_backwards_ = 0;
    make_reducer();
  }
}

void Ddp::backward(const torch::Tensor& loss_in) {
  unsynced_ = !sync_;  // whichever path below: this backward synchronizes exactly when sync_
  if (options_.shard_optimizer_state) {
    if (!shard_)
      throw Error(
          "fabric.ddp.shard_optimizer_state: backward before the optimizer was set up; "
          "pass it to Fabric::setup(model, optimizer)");
    precision_->backward(loss_in);
    if (sync_) {
      shard_->reduce_scatter_gradients();
      ++synced_backwards_;
    }
    return;
  }
  if (capturable_) {  // after backward, through persistent buffers: nothing on the host between
    precision_->backward(loss_in);
    if (flat_sync_ && sync_) {
      flat_sync_->run();
      ++synced_backwards_;
    }
    return;
  }
  torch::Tensor loss = loss_in;
  if (reducer_ && sync_) {
    if (options_.static_graph && reducer_backwards_ == 0)
      loss = StaticGraphFirstIterationSink::apply(loss, reducer_.get());
    // The Reducer counts iterations here (PyTorch calls it before forward); static_graph relies
    // on the count to delay the first iteration's all-reduce to the end of backward.
    reducer_->prepare_for_forward();
    reducer_->rebuild_buckets();  // collective on every rank; real work once, after iteration 1
    reducer_->prepare_for_backward(options_.find_unused_parameters && !options_.static_graph
                                       ? std::vector<torch::Tensor>{loss}
                                       : std::vector<torch::Tensor>{});
    ++reducer_backwards_;
    ++synced_backwards_;
  }
  precision_->backward(loss);
}

bool Ddp::optimizer_step(torch::optim::Optimizer& optimizer) {
  if (shard_ && !shard_of(optimizer))
    throw Error(
        "fabric.ddp.shard_optimizer_state: step of an optimizer that was not set up "
        "with the module; pass it to Fabric::setup(model, optimizer)");
  const bool stepped = precision_->optimizer_step(optimizer);
  if (shard_) shard_->gather_parameters();
  if (options_.broadcast_buffers) broadcast_buffers();
  return stepped;
}

void Ddp::sync_unsynced_gradients() {
  if (!unsynced_) return;
  // The flat sync needs every gradient; the Reducer's find_unused_parameters treats a missing one
  // as zeros during a synchronized backward only.
  if (!shard_ && !capturable_)
    for (size_t i = 0; i < params_.size(); ++i)
      if (!params_[i].grad().defined())
        throw Error("ddp: parameter '" + param_names_[i] +
                    "' has no gradient, and every backward since the last synchronization ran "
                    "inside no_backward_sync: run the step's last backward outside it (or set "
                    "fabric.sync_before_step: false to keep each rank's own gradients)");
  // The accumulated gradients, averaged now (collective on every rank).
  if (shard_) {
    shard_->reduce_scatter_gradients();
  } else if (flat_sync_) {
    flat_sync_->run();
  }
  unsynced_ = false;
  ++synced_backwards_;
}

void Ddp::broadcast_buffers() {
  if (buffers_.empty() || world_size() == 1) return;
  torch::NoGradGuard no_grad;
  c10d::broadcast_coalesced(process_group(), buffers_, 250 * 1024 * 1024, 0);
}

ScopeGuard Ddp::no_backward_sync() {
  const bool previous = sync_;
  sync_ = false;
  return ScopeGuard([this, previous] { sync_ = previous; });
}

}  // namespace fabric::strategies
