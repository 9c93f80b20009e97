#include "strategies/ddp.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <unordered_set>

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

struct Ddp::Replica {
  std::vector<torch::Tensor> params;  // those that require gradients, in module order
  std::vector<std::string> names;
  int ordinal = 1;                         // the module's place among those set up: 1, 2, ...
  std::shared_ptr<c10d::Reducer> reducer;  // none while capturable_ or under the optimizer shard
  std::unique_ptr<FlatGradientSync> flat_sync;
  int64_t reducer_backwards = 0;  // backward passes synchronized by the Reducer
  bool unsynced = false;          // reached by a backward inside no_backward_sync since its sync
};

Ddp::Ddp(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
         std::unique_ptr<Precision> precision, DdpOptions options, std::vector<std::string> argv)
    : ParallelStrategy(std::move(environment), device, std::move(precision),
                       rendezvous_options(options, std::move(argv))),
      options_(std::move(options)) {}

Ddp::~Ddp() = default;

void Ddp::release() {
  for (auto& r : replicas_) {
    r->reducer.reset();
    r->flat_sync.reset();
  }
  shard_.reset();
}

namespace {

// "the module set up first" / "second" / "third" / "Nth": how errors name a replica.
std::string module_named(int ordinal) {
  static const char* const words[] = {"first", "second", "third", "fourth", "fifth"};
  const std::string place =
      ordinal >= 1 && ordinal <= 5 ? words[ordinal - 1] : std::to_string(ordinal) + "th";
  return "the module set up " + place;
}

}  // namespace

void Ddp::setup_module(torch::nn::Module& module) {
  const auto& pg = group_for("setup_module");
  materialize_empty_init(module, device_);
  module.to(device_);
  convert_module(module);
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    names.push_back(item.key());
    params.push_back(item.value());
  }
  const int ordinal = ++modules_set_up_;  // frozen ones count: errors name the setup call
  if (!params.empty() && !replicas_.empty()) {
    // What takes one trainable module: said before anything of this one is changed further.
    const char* one = options_.shard_optimizer_state ? "fabric.ddp.shard_optimizer_state"
                      : options_.static_graph        ? "fabric.ddp.static_graph"
                      : capturable_                  ? "fabric.cuda_graphs"
                                                     : nullptr;
    if (one != nullptr)
      throw Error(std::string(one) +
                  ": takes one module with parameters that require gradients; this job set up "
                  "a second one: put the modules in one torch::nn::Module and set it up once, "
                  "or set " +
                  one + ": false");
  }
  if (options_.sync_batchnorm && !params.empty()) {
    // Before collecting buffers: swapped modules keep the same parameter tensors anyway.
    sync_batchnorm_modules_ +=
        static_cast<int64_t>(nn::convert_sync_batchnorm_or_throw(module, pg).synchronized.size());
  }
  // Frozen: nothing to synchronize. Every rank built it with the same seed or loads the same
  // weights into it (broadcasting a large teacher would only cost time). Its parameters are
  // kept, so that one unfrozen later is an error rather than a replica that drifts.
  if (params.empty()) {
    for (const auto& item : module.named_parameters())
      frozen_.emplace_back(item.value(), module_named(ordinal) + "'s '" + item.key() + "'");
    return;
  }
  // A parameter another set-up module holds would get two Reducers' hooks.
  for (size_t i = 0; i < params.size(); ++i)
    if (!synchronized_.insert(params[i].unsafeGetTensorImpl()).second)
      throw Error("ddp: " + module_named(ordinal) + " shares its parameter '" + names[i] +
                  "' with a module set up before it; set up the module that holds both once");
  std::vector<torch::Tensor> buffers;
  for (const auto& b : module.buffers()) buffers.push_back(b);

  // Same shapes everywhere, then rank 0's values everywhere.
  c10d::verify_params_across_processes(pg, params, std::nullopt);
  std::vector<torch::Tensor> state = params;
  state.insert(state.end(), buffers.begin(), buffers.end());
  {
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(pg, state, 250 * 1024 * 1024, 0);
  }
  buffers_.insert(buffers_.end(), buffers.begin(), buffers.end());
  auto replica = std::make_unique<Replica>();
  replica->params = params;
  replica->names = names;
  replica->ordinal = ordinal;
  Replica& r = *replica;
  replicas_.push_back(std::move(replica));
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
  if (!capturable_) make_reducer(r);
  r.flat_sync =
      std::make_unique<FlatGradientSync>(params, std::move(names), pg, options_.comm_hook);
}

void Ddp::make_reducer(Replica& r) {
  const std::vector<torch::Tensor>& params = r.params;
  const std::vector<std::string>& names = r.names;
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
  r.reducer_backwards = 0;
  r.reducer = std::make_shared<c10d::Reducer>(
      params, indices, process_group(), std::vector<bool>(params.size(), false), cap,
      options_.find_unused_parameters, options_.gradient_as_bucket_view, names_by_index,
      c10d::kDefaultFirstBucketBytes, /*skip_all_reduce_unused_params=*/false,
      /*use_python_reducer=*/false, /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  if (options_.static_graph) r.reducer->set_static_graph();
  if (options_.comm_hook == CommHook::kFp16)
    r.reducer->register_builtin_comm_hook(c10d::BuiltinCommHookType::FP16_COMPRESS);
  if (options_.comm_hook == CommHook::kBf16)
    r.reducer->register_comm_hook(std::make_unique<Bf16CompressHook>(process_group()));
}

void Ddp::setup_optimizer(torch::optim::Optimizer& optimizer) {
  if (!options_.shard_optimizer_state) return;
  if (replicas_.empty())
    throw Error(
        "fabric.ddp.shard_optimizer_state: set up the module before its optimizer "
        "(Fabric::setup(model, optimizer) does)");
  if (shard_)
    throw Error(
        "fabric.ddp.shard_optimizer_state: supports one optimizer; this job set up a "
        "second one");
  shard_ = std::make_unique<OptimizerShard>(optimizer, replicas_.front()->params,
                                            replicas_.front()->names, group_for("setup_optimizer"));
  agree_on_found_inf();
}

void Ddp::set_capturable_gradient_sync(bool on) {
  if (on && options_.shard_optimizer_state)
    throw Error(
        "fabric.cuda_graphs: not supported with fabric.ddp.shard_optimizer_state; set "
        "one of them to false");
  if (on && replicas_.size() > 1)
    throw Error(
        "fabric.cuda_graphs: takes one module with parameters that require gradients under "
        "ddp; this job set up " +
        std::to_string(replicas_.size()) +
        ": put them in one torch::nn::Module, or set fabric.cuda_graphs: false");
  capturable_ = on;
  // The Reducer keeps every parameter's AccumulateGrad node alive, and a node runs on the stream
  // it was made on (the default one at setup): a backward captured on a side stream would make
  // the default stream wait on the capture, which CUDA refuses ("operation would make the legacy
  // stream depend on a capturing blocking stream"). Without it, the nodes are made afresh on the
  // capturing stream, as PyTorch asks of DDP ("construct it in a side-stream context").
  for (auto& r : replicas_) {
    if (on) {
      r->reducer.reset();
    } else if (!r->reducer && r->flat_sync) {  // set up and not torn down
      make_reducer(*r);
    }
  }
}

std::vector<Ddp::Replica*> Ddp::reached_by(const torch::Tensor& loss, bool* uneven) {
  *uneven = false;
  for (const auto& [p, name] : frozen_)
    if (p.requires_grad())
      throw Error("ddp: " + name +
                  " requires a gradient now, but its module was set up frozen (nothing "
                  "synchronizes it, so the replicas would drift apart); unfreeze before setting "
                  "the module up");
  std::vector<Replica*> out;
  if (replicas_.size() == 1) {
    out.push_back(replicas_.front().get());
    return out;
  }
  // Every node of the loss's graph; a parameter is reached when its AccumulateGrad node is one.
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo;
  if (const auto& root = loss.grad_fn()) {
    seen.insert(root.get());
    todo.push_back(root.get());
  }
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    for (const auto& edge : node->next_edges())
      if (edge.function && seen.insert(edge.function.get()).second)
        todo.push_back(edge.function.get());
  }
  // Each module's reached parameters here, then over the ranks (a data-dependent branch may reach
  // a module on some ranks only): the largest count and the smallest (negated, one all-reduce).
  const auto n = static_cast<int64_t>(replicas_.size());
  std::vector<const std::string*> missed(replicas_.size(), nullptr);
  std::vector<float> counts(static_cast<size_t>(2 * n));
  for (int64_t r = 0; r < n; ++r) {
    const Replica& replica = *replicas_[static_cast<size_t>(r)];
    int64_t reached = 0;
    for (size_t i = 0; i < replica.params.size(); ++i) {
      const auto accumulator = torch::autograd::impl::try_get_grad_accumulator(replica.params[i]);
      if (accumulator && seen.count(accumulator.get())) {
        ++reached;
      } else if (missed[static_cast<size_t>(r)] == nullptr) {
        missed[static_cast<size_t>(r)] = &replica.names[i];
      }
    }
    counts[static_cast<size_t>(r)] = static_cast<float>(reached);
    counts[static_cast<size_t>(n + r)] = -static_cast<float>(reached);
  }
  const torch::Tensor agreed =  // on the device: NCCL reduces only there
      all_reduce(torch::tensor(counts).to(device_), ReduceOp::kMax).to(torch::kCPU);
  const auto* reached_anywhere = agreed.data_ptr<float>();
  for (int64_t r = 0; r < n; ++r) {
    Replica& replica = *replicas_[static_cast<size_t>(r)];
    const auto most = static_cast<size_t>(reached_anywhere[r]);
    const auto least = static_cast<size_t>(-reached_anywhere[n + r]);
    if (most == 0) continue;  // no rank's loss reaches it
    *uneven = *uneven || least < most;
    if (least < replica.params.size() && !options_.find_unused_parameters) {
      const std::string* name = missed[static_cast<size_t>(r)];
      throw Error("ddp: this backward reaches " + std::to_string(least) + " of the " +
                  std::to_string(replica.params.size()) + " parameters of " +
                  module_named(replica.ordinal) +
                  (name != nullptr ? " (not '" + *name + "')" : std::string(" on some rank")) +
                  ": set fabric.ddp.find_unused_parameters: true, or freeze the parameters the "
                  "loss does not use");
    }
    out.push_back(&replica);
  }
  return out;
}

void Ddp::backward(const torch::Tensor& loss_in) {
  if (options_.shard_optimizer_state) {
    unsynced_ = !sync_;
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
  // The modules this backward reaches: it synchronizes exactly those when sync_, else leaves
  // them to sync_unsynced_gradients.
  bool uneven = false;
  const std::vector<Replica*> reached = reached_by(loss_in, &uneven);
  for (Replica* r : reached) r->unsynced = !sync_;
  unsynced_ = false;
  for (const auto& r : replicas_) unsynced_ = unsynced_ || r->unsynced;
  if (capturable_) {  // after backward, through persistent buffers: nothing on the host between
    precision_->backward(loss_in);
    if (sync_ && !reached.empty() && reached.front()->flat_sync) {
      reached.front()->flat_sync->run();
      ++synced_backwards_;
    }
    return;
  }
  if (sync_ && uneven) {
    // The ranks' graphs differ (a module some reach and others do not): Reducers, which start
    // all-reduces as gradients arrive, would start them in each rank's own order. After the
    // backward instead, module by module in setup order, a missing gradient as zeros (what
    // find_unused_parameters means by unused).
    precision_->backward(loss_in);
    for (Replica* r : reached) {
      if (!r->flat_sync) continue;
      for (auto& p : r->params)
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      r->flat_sync->run();
    }
    ++synced_backwards_;
    return;
  }
  torch::Tensor loss = loss_in;
  if (sync_ && !reached.empty()) {
    for (Replica* r : reached) {
      if (!r->reducer) continue;
      if (options_.static_graph && r->reducer_backwards == 0)
        loss = StaticGraphFirstIterationSink::apply(loss, r->reducer.get());
      // The Reducer counts iterations here (PyTorch calls it before forward); static_graph
      // relies on the count to delay the first iteration's all-reduce to the end of backward.
      r->reducer->prepare_for_forward();
      r->reducer->rebuild_buckets();  // collective on every rank; real work once, after iteration 1
      r->reducer->prepare_for_backward(options_.find_unused_parameters && !options_.static_graph
                                           ? std::vector<torch::Tensor>{loss}
                                           : std::vector<torch::Tensor>{});
      ++r->reducer_backwards;
    }
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
  if (shard_) {
    shard_->reduce_scatter_gradients();
  } else {
    // The flat sync needs every gradient; the Reducer's find_unused_parameters treats a missing
    // one as zeros during a synchronized backward only.
    for (const auto& r : replicas_) {
      if (!r->unsynced || capturable_) continue;
      // Gradients the loop cleared since (zero_grad to none, as a GAN's discriminator step
      // does): nothing of this module to synchronize.
      bool any = false;
      for (const auto& p : r->params) any = any || p.grad().defined();
      if (!any) {
        r->unsynced = false;
        continue;
      }
      for (size_t i = 0; i < r->params.size(); ++i)
        if (!r->params[i].grad().defined())
          throw Error("ddp: parameter '" + r->names[i] +
                      "' has no gradient, and every backward since the last synchronization ran "
                      "inside no_backward_sync: run the step's last backward outside it (or set "
                      "fabric.sync_before_step: false to keep each rank's own gradients)");
    }
    // The accumulated gradients, averaged now (collective on every rank).
    for (const auto& r : replicas_)
      if (r->unsynced && r->flat_sync) r->flat_sync->run();
  }
  for (const auto& r : replicas_) r->unsynced = false;
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
