#include "strategies/ddp.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#ifdef FABRIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include "fabric/core/error.h"
#include "fabric/core/output.h"
#include "fabric/distributed/collective_check.h"
#include "fabric/distributed/heartbeat.h"
#include "fabric/distributed/process_group.h"
#include "fabric/launchers/subprocess_launcher.h"
#include "fabric/nn/batch_norm.h"
#include "strategies/flat_gradient_sync.h"

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

bool is_loopback(const std::string& host) {
  return host == "127.0.0.1" || host == "localhost" || host == "::1";
}

}  // namespace

Ddp::Ddp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
         std::unique_ptr<Precision> precision, DdpOptions options, std::vector<std::string> argv)
    : Strategy(std::move(precision)),
      env_(std::move(environment)),
      device_(device),
      options_(std::move(options)),
      argv_(std::move(argv)) {
  if (options_.comm_hook != "none" && options_.comm_hook != "fp16" && options_.comm_hook != "bf16")
    throw Error("fabric.ddp.comm_hook: '" + options_.comm_hook + "' is not none, fp16 or bf16");
}

Ddp::~Ddp() = default;

void Ddp::setup_environment() {
#ifdef FABRIC_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::set_device(device_.index());
#endif
  const int64_t world = env_->world_size();
  const bool self_launch = !env_->creates_processes_externally();
  const bool host = env_->global_rank() == 0;
  distributed::StoreOptions store;
  store.host = env_->main_address();
  store.port = env_->main_port();
  // Under torchrun's agent store every rank is a client of the agent's store.
  store.is_server = host && !env_->store_hosted_by_launcher();
  store.prefix = env_->store_prefix();
  store.world_size = world;
  store.timeout = options_.timeout;
  // A job on one machine keeps its store on loopback; one spanning nodes must accept them all.
  const bool single_node = self_launch || is_loopback(env_->main_address());
  if (!single_node) store.listen_address = "";
  if (env_->main_address() == "::1") store.listen_address = "::1";
  store_ = distributed::make_store(store);
  if (self_launch && host && world > 1) {
    // Rank 0 bound an ephemeral port; the children learn it from FABRIC_MASTER_PORT.
    launcher_ = std::make_unique<SubprocessLauncher>(
        LaunchOptions{world, distributed::store_port(store_)}, argv_);
  }
  distributed::ProcessGroupOptions pg;
  pg.rank = env_->global_rank();
  pg.world_size = world;
  pg.timeout = options_.timeout;
  pg.cuda = device_.is_cuda();
  pg.cuda_device = device_.is_cuda() ? device_.index() : 0;
  pg.cuda_with_gloo = options_.cuda_with_gloo;
  pg.single_node = single_node;
  pg.cpu_backend = options_.cpu_backend;
  pg_ = distributed::make_process_group(store_, pg);
  if (options_.debug_collectives && world > 1) {
    checker_ = std::make_unique<distributed::CollectiveChecker>(store_, env_->global_rank(), world,
                                                                options_.timeout);
  }
  if (!self_launch && world > 1 && options_.heartbeat_timeout.count() > 0) {
    distributed::HeartbeatOptions hb;
    hb.host = env_->main_address();
    hb.port = distributed::store_port(store_);
    hb.prefix = env_->store_prefix();
    hb.rank = env_->global_rank();
    hb.world_size = world;
    hb.timeout = options_.heartbeat_timeout;
    hb.interval = std::min(std::chrono::milliseconds(1000), options_.heartbeat_timeout / 5);
    const int64_t rank = env_->global_rank();
    heartbeat_ = std::make_unique<distributed::Heartbeat>(hb, [rank](const std::string& why) {
      // The main thread may be blocked in a collective that will never complete: like the
      // self-launcher, this is a place where Fabric ends the process itself.
      write_to_terminal("error (rank " + std::to_string(rank) + "): " + why +
                        "; stopping this rank (fabric.ddp.heartbeat_timeout_s)");
      std::_Exit(1);
    });
  }
}

void Ddp::teardown() {
  reducer_.reset();
  flat_sync_.reset();
  if (pg_) {
    pg_->barrier()->wait();  // nobody leaves while others still need the store (rank 0 hosts it)
    if (heartbeat_) {
      heartbeat_->stop();
      heartbeat_->finish();  // rank 0 keeps the store until every rank has stopped beating
    }
    pg_->shutdown();
  }
  if (launcher_) launcher_->wait();
}

void Ddp::teardown_after_error() {
  reducer_.reset();
  flat_sync_.reset();
  if (heartbeat_) {
    heartbeat_->report_failure("rank " + std::to_string(env_->global_rank()) +
                               " failed (its own error line says why)");
  }
  launcher_.reset();  // stops the other ranks of a self-launched job
  if (pg_) {
    try {
      pg_->abort();  // c10d: cancels pending communication; the process itself carries on
    } catch (const std::exception&) {
      // Best effort: the process is about to report its error and exit.
    }
  }
}

void Ddp::setup_module(torch::nn::Module& module) {
  if (!pg_) throw Error("ddp: setup_module before launch (call it inside Fabric::launch)");
  module.to(device_);
  precision_->convert_module(module);
  if (options_.sync_batchnorm) {
    // Before collecting parameters: swapped modules keep the same parameter tensors anyway.
    sync_batchnorm_modules_ =
        static_cast<int64_t>(nn::convert_sync_batchnorm_or_throw(module, pg_).synchronized.size());
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
  c10d::verify_params_across_processes(pg_, params, std::nullopt);
  std::vector<torch::Tensor> state = params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  {
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(pg_, state, 250 * 1024 * 1024, 0);
  }

  params_ = params;
  param_names_ = names;
  reducer_.reset();
  reducer_backwards_ = 0;
  if (!capturable_) make_reducer();
  flat_sync_ =
      std::make_unique<FlatGradientSync>(params, std::move(names), pg_, options_.comm_hook);
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
      params, indices, pg_, std::vector<bool>(params.size(), false), cap,
      options_.find_unused_parameters, options_.gradient_as_bucket_view, names_by_index,
      c10d::kDefaultFirstBucketBytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  if (options_.static_graph) reducer_->set_static_graph();
  if (options_.comm_hook == "fp16")
    reducer_->register_builtin_comm_hook(c10d::BuiltinCommHookType::FP16_COMPRESS);
  if (options_.comm_hook == "bf16")
    reducer_->register_comm_hook(std::make_unique<Bf16CompressHook>(pg_));
}

void Ddp::set_capturable_gradient_sync(bool on) {
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
  const bool stepped = precision_->optimizer_step(optimizer);
  if (options_.broadcast_buffers) broadcast_buffers();
  return stepped;
}

void Ddp::broadcast_buffers() {
  if (buffers_.empty() || world_size() == 1) return;
  torch::NoGradGuard no_grad;
  c10d::broadcast_coalesced(pg_, buffers_, 250 * 1024 * 1024, 0);
}

torch::Tensor Ddp::all_reduce(const torch::Tensor& tensor, ReduceOp op) {
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
  static const char* const kOps[] = {"all_reduce(sum)", "all_reduce(mean)", "all_reduce(max)",
                                     "all_reduce(min)"};
  distributed::wait(pg_->allreduce(t, o), begin_collective(kOps[static_cast<int>(op)], &tensor));
  if (op == ReduceOp::kMean) {
    return t[0].is_floating_point() ? t[0] / static_cast<double>(world_size())
                                    : t[0].div(world_size(), "floor");
  }
  return t[0];
}

void Ddp::barrier() { distributed::wait(pg_->barrier(), begin_collective("barrier", nullptr)); }

torch::Tensor Ddp::broadcast(const torch::Tensor& tensor, int64_t src) {
  if (src < 0 || src >= world_size())
    throw Error("broadcast: src " + std::to_string(src) + " does not exist (world size " +
                std::to_string(world_size()) + ")");
  std::vector<torch::Tensor> t = {tensor.clone()};
  c10d::BroadcastOptions o;
  o.rootRank = src;
  distributed::wait(pg_->broadcast(t, o),
                    begin_collective("broadcast(from " + std::to_string(src) + ")", &tensor));
  return t[0];
}

std::vector<torch::Tensor> Ddp::all_gather(const torch::Tensor& tensor) {
  return distributed::all_gather(*pg_, tensor, begin_collective("all_gather", &tensor));
}

std::string Ddp::begin_collective(const std::string& kind, const torch::Tensor* tensor) {
  const int64_t seq = ++collectives_;
  const std::string signature = distributed::collective_signature(kind, tensor);
  if (checker_) checker_->check(seq, signature);
  return kind + " #" + std::to_string(seq) +
         (tensor != nullptr ? " (" + signature.substr(kind.size() + 1) + ")" : "");
}

ScopeGuard Ddp::no_backward_sync(torch::nn::Module& module) {
  (void)module;
  const bool previous = sync_;
  sync_ = false;
  return ScopeGuard([this, previous] { sync_ = previous; });
}

}  // namespace fabric::strategies
