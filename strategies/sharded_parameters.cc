#include "strategies/sharded_parameters.h"

// RecordFunction's layout differs with NDEBUG (a debug-only member); this file is compiled with
// NDEBUG so that it reads the structure as the LibTorch library built it (see BUILD.bazel).
#include <ATen/native/TensorFactories.h>
#include <ATen/record_function.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/types.h>

#include <algorithm>
#include <atomic>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "fabric/nn/empty_init.h"

namespace fabric::strategies {
namespace {

constexpr const char* kKey = "fabric.strategy: fsdp";

std::atomic<ShardedParameters*> g_instance{nullptr};
thread_local bool t_inside = false;  // in our own gather/reduce: operators are ours

struct Inside {
  Inside() : previous(t_inside) { t_inside = true; }
  ~Inside() { t_inside = previous; }
  bool previous;
  at::RecordFunctionGuard off{false};  // no callbacks for the operators of a gather
};

std::string describe(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " [" + std::to_string(t.numel()) + "]";
}

std::unique_ptr<at::ObserverContext> on_operator(const at::RecordFunction& fn);

}  // namespace

ShardedParameters::ShardedParameters(torch::nn::Module& module,
                                     c10::intrusive_ptr<c10d::ProcessGroup> pg,
                                     ShardingPolicy policy)
    : pg_(std::move(pg)), policy_(std::move(policy)) {
  rank_ = pg_->getRank();
  world_ = pg_->getSize();

  form_units(module);
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < units_.size(); ++k) flatten_unit(k);
  peak_gathered_bytes_ = 0;
  for (size_t k = 0; k < units_.size(); ++k)
    for (size_t i = 0; i < units_[k].names.size(); ++i)
      by_path_[sharded_path({units_[k].names[i]})] = {k, i};

  install_gradient_hooks();

  ShardedParameters* expected = nullptr;
  if (!g_instance.compare_exchange_strong(expected, this))
    throw Error(std::string(kKey) +
                ": one module per process is sharded; this job set up a second one");
  callback_ = at::addThreadLocalCallback(at::RecordFunctionCallback(&on_operator)
                                             .needsInputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
}

// The units of the policy (sharded_parameters_units.cc), as this class keeps them.
void ShardedParameters::form_units(torch::nn::Module& module) {
  for (auto& planned : plan_units(module, policy_)) {
    Unit u;
    u.name = std::move(planned.name);
    u.root = planned.root;
    u.frozen = planned.frozen;
    u.group = planned.group;
    u.names = std::move(planned.names);
    u.params = std::move(planned.params);
    units_.push_back(std::move(u));
  }
}

void ShardedParameters::flatten_unit(size_t k) {
  Unit& u = units_[k];
  const torch::Tensor& first = u.params[0];
  std::vector<int64_t> numels;
  for (size_t i = 0; i < u.params.size(); ++i) {
    const torch::Tensor& p = u.params[i];
    if (p.scalar_type() != first.scalar_type() || p.device() != first.device())
      throw Error(std::string(kKey) + ": unit '" + u.name + "': parameter '" + u.names[i] +
                  "' is " + std::string(c10::toString(p.scalar_type())) + " on " +
                  p.device().str() + ", '" + u.names[0] + "' is " +
                  std::string(c10::toString(first.scalar_type())) + " on " + first.device().str() +
                  "; a unit needs one dtype and device (wrap them apart with "
                  "fabric.fsdp.wrap_modules)");
    if (p.is_sparse())
      throw Error(std::string(kKey) + ": parameter '" + u.names[i] + "' is sparse");
    numels.push_back(p.numel());
  }
  const FlatLayout layout = flat_layout(numels, first.element_size(), world_);
  u.offsets = layout.offsets;
  u.total = layout.total;
  u.shard_size = layout.shard_size;
  const bool empty_init = first.is_meta();  // values come later: take_initial_value
  const auto options = first.options().requires_grad(false).device(
      empty_init ? policy_.empty_init_device : first.device());
  u.full = torch::zeros({world_ * u.shard_size}, options);
  // Where the shard and its gradient live: beside the units, or in host memory (cpu_offload).
  const auto held = policy_.cpu_offload
                        ? options.device(torch::kCPU).pinned_memory(options.device().is_cuda())
                        : options;
  u.shard = torch::zeros({u.shard_size}, held);
  if (!empty_init) {
    for (size_t i = 0; i < u.params.size(); ++i)
      u.full.narrow(0, u.offsets[i], u.params[i].numel()).copy_(u.params[i].reshape(-1));
    u.shard.copy_(u.full.narrow(0, rank_ * u.shard_size, u.shard_size));
  }
  if (!u.frozen) u.shard_grad = torch::zeros({u.shard_size}, held);
  for (size_t i = 0; i < u.params.size(); ++i) {
    torch::Tensor& p = u.params[i];
    const std::vector<int64_t> sizes = p.sizes().vec();
    if (empty_init) replace_data(p, torch::empty({0}, options));
    p.set_(u.full.storage(), u.offsets[i], sizes, c10::contiguous_strides(sizes));
    by_object_[p.unsafeGetTensorImpl()] = {k, i};
  }
  u.gathered = true;
  gathered_bytes_ += static_cast<int64_t>(u.full.storage().nbytes());
  unit_of_storage_[u.full.storage().unsafeGetStorageImpl()] = k;
  release(u);
}

bool ShardedParameters::take_initial_value(const torch::Tensor& held, const torch::Tensor& value) {
  auto it = by_object_.find(held.unsafeGetTensorImpl());
  if (it == by_object_.end()) return false;
  const Unit& u = units_[it->second.first];
  const size_t i = it->second.second;
  if (value.numel() != u.params[i].numel())
    throw Error(std::string(kKey) + ": parameter '" + u.names[i] + "' has " +
                std::to_string(u.params[i].numel()) + " elements, its empty init's value " +
                std::to_string(value.numel()));
  const auto [x, y] = own_range(u, i);
  if (x < y) {
    torch::NoGradGuard no_grad;
    own_values(u, i).copy_(value.reshape(-1).narrow(0, x, y - x));
  }
  return true;
}

void ShardedParameters::install_gradient_hooks() {
  // After the gradient of each parameter is accumulated.
  for (size_t k = 0; k < units_.size(); ++k) {
    if (units_[k].frozen) continue;  // no gradients
    for (const auto& p : units_[k].params) {
      auto node = torch::autograd::impl::grad_accumulator(p);
      const uintptr_t key =
          node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
              [this, k](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list&) {
                on_gradient(k);
                return outputs;
              }));
      hooks_.emplace_back(node, key);
      accumulators_.push_back(std::move(node));
    }
  }
}

ShardedParameters::~ShardedParameters() {
  for (auto& u : units_) {
    if (!u.pending) continue;
    try {
      u.pending->wait();  // never leave a collective writing into memory about to be freed
    } catch (...) {
    }
  }
  if (callback_ != 0) at::removeCallback(callback_);
  ShardedParameters* self = this;
  g_instance.compare_exchange_strong(self, nullptr);
  for (auto& [node, key] : hooks_) node->del_post_hook(key);
}

void ShardedParameters::start_gather(Unit& u, bool exact) {
  Inside inside;
  if (!u.gathered) {
    c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
    const size_t bytes = static_cast<size_t>(u.full.numel()) * u.full.element_size();
    storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
    storage->set_nbytes(bytes);
    gathered_bytes_ += static_cast<int64_t>(bytes);
    peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
  }
  const auto wire = policy_.param_dtype;
  // Rounded through param_dtype only when that is fewer bytes (a frozen float8 or bfloat16 unit
  // travels as it is).
  if (!exact && wire && *wire != u.full.scalar_type() &&
      c10::elementSize(*wire) < u.full.element_size()) {
    // Half the bytes on the wire (for bf16/fp16); every rank computes with the same rounded
    // values once finish_gather upcasts them into the buffer.
    torch::NoGradGuard no_grad;
    u.pending_send = on_device(u.shard.to(*wire), u);
    u.pending_received = torch::empty({u.full.numel()}, u.pending_send.options());
    u.pending = pg_->_allgather_base(u.pending_received, u.pending_send);
    u.exact = false;
  } else if (c10::isFloat8Type(u.full.scalar_type())) {
    // Backends reduce no float8; a gather moves bytes.
    torch::Tensor full = u.full.view(torch::kUInt8);
    u.pending_send = on_device(u.shard, u).view(torch::kUInt8);
    u.pending = pg_->_allgather_base(full, u.pending_send);
    u.exact = true;
  } else {
    u.pending_send = on_device(u.shard, u);
    u.pending = pg_->_allgather_base(u.full, u.pending_send);
    u.exact = true;
  }
  u.gathered = true;
  ++gathers_;
}

torch::Tensor ShardedParameters::on_device(const torch::Tensor& shard, const Unit& u) const {
  if (!policy_.cpu_offload) return shard;
  return shard.to(u.full.device(), /*non_blocking=*/true, /*copy=*/true);
}

void ShardedParameters::finish_gather(Unit& u) {
  if (!u.pending) return;
  Inside inside;
  auto work = std::move(u.pending);
  u.pending.reset();
  distributed::wait(
      work, std::string("fsdp all_gather of unit '") + u.name + "' (" + describe(u.full) + ")");
  u.pending_send = torch::Tensor();
  if (u.pending_received.defined()) {
    torch::NoGradGuard no_grad;
    u.full.copy_(u.pending_received);
    u.pending_received = torch::Tensor();
  }
}

void ShardedParameters::note_use(size_t k) {
  if (std::find(used_now_.begin(), used_now_.end(), k) != used_now_.end()) return;
  used_now_.push_back(k);
  if (!policy_.prefetch) return;
  const auto& order = in_backward_ ? backward_order_ : forward_order_;
  auto it = std::find(order.begin(), order.end(), k);
  if (it == order.end() || it + 1 == order.end()) return;
  Unit& next = units_[*(it + 1)];
  if (next.gathered) return;  // gathered, or its prefetch is in flight
  start_gather(next, /*exact=*/false);
  ++prefetches_;
}

void ShardedParameters::gather(Unit& u, bool exact) {
  finish_gather(u);
  if (u.gathered && (u.exact || !exact)) return;
  start_gather(u, exact);
  finish_gather(u);
}

void ShardedParameters::release(Unit& u) {
  if (!u.gathered || u.pins > 0) return;
  finish_gather(u);  // its memory is being written
  c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
  gathered_bytes_ -= static_cast<int64_t>(storage->nbytes());
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, u.full.device()));
  storage->set_nbytes(0);
  u.gathered = false;
}

void ShardedParameters::on_operator_inputs(c10::ArrayRef<const c10::IValue> inputs) {
  // Every unit this operator takes is gathered before it runs (and none of them freed): a
  // foreach operator over all parameters takes every unit.
  c10::SmallVector<size_t, 8> used;  // gathered or not
  bool missing = false;
  auto note = [&](const at::Tensor& t) {
    if (!t.defined() || !t.has_storage()) return;
    auto it = unit_of_storage_.find(t.storage().unsafeGetStorageImpl());
    if (it == unit_of_storage_.end()) return;
    missing = missing || !units_[it->second].gathered;
    if (std::find(used.begin(), used.end(), it->second) == used.end()) used.push_back(it->second);
  };
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      note(v.toTensor());
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor()) note(e.toTensor());
    }
  }
  for (size_t k : used) missing = missing || units_[k].pending;
  if (!missing) return;
  if (policy_.reshard_after_forward) {
    // The forward frees every other unit; the backward the frozen ones (a trainable unit is
    // freed once its gradients are reduced). A unit used now keeps its siblings (an adapted
    // layer's base and adapters).
    c10::SmallVector<size_t, 8> groups;
    for (size_t k : used) groups.push_back(units_[k].group);
    for (size_t k = 0; k < units_.size(); ++k) {
      const Unit& u = units_[k];
      if (u.root || u.pending || (in_backward_ && !u.frozen) ||
          std::find(groups.begin(), groups.end(), u.group) != groups.end())
        continue;
      release(units_[k]);
    }
  }
  for (size_t k : used) {
    gather(units_[k]);
    note_use(k);
  }
}

void ShardedParameters::on_gradient(size_t k) {
  if (!in_backward_ || !sync_ || units_[k].frozen) return;
  Unit& u = units_[k];
  if (++u.grads_ready == u.params.size() && !u.reduced) reduce(u);
}

void ShardedParameters::set_replicate_group(c10::intrusive_ptr<c10d::ProcessGroup> group) {
  replicate_ = std::move(group);
}

void ShardedParameters::reduce(Unit& u) {
  Inside inside;
  torch::NoGradGuard no_grad;
  const auto wire = policy_.reduce_dtype.value_or(u.shard_grad.scalar_type());
  // On the units' device: under cpu_offload the shard's gradient is in host memory, and the
  // gradients and the collective are on the device (an H200 on 2026-11-30 failed here with
  // "found at least two devices, cuda:0 and cpu").
  torch::Tensor flat = torch::empty({world_ * u.shard_size}, u.full.options().dtype(wire));
  zero_gaps(flat, u.offsets, u.params);  // the layout's gaps and padding
  // The Reducer's factor: a wrapped double scalar, the product computed in the gradient's dtype.
  const auto& replicas = replicate_;
  const int64_t copies = replicas ? replicas->getSize() : 1;
  const torch::Tensor inverse_world =
      at::native::wrapped_scalar_tensor(1.0 / static_cast<double>(world_ * copies));
  for (size_t i = 0; i < u.params.size(); ++i) {
    torch::Tensor slot = flat.narrow(0, u.offsets[i], u.params[i].numel());
    const torch::Tensor& grad = u.params[i].grad();
    if (!grad.defined()) {
      slot.zero_();
    } else {
      if (grad.is_sparse())
        throw Error(std::string(kKey) + ": parameter '" + u.names[i] + "' has a sparse gradient");
      at::mul_out(slot, grad.reshape(-1), inverse_world);
    }
  }
  for (auto& p : u.params) p.mutable_grad().reset();
  const bool direct = !accumulate_ && wire == u.shard_grad.scalar_type() && !policy_.cpu_offload;
  torch::Tensor out = direct ? u.shard_grad : torch::empty({u.shard_size}, flat.options());
  distributed::wait(pg_->_reduce_scatter_base(out, flat),
                    std::string("fsdp reduce_scatter of unit '") + u.name + "' gradients (" +
                        describe(flat) + ")");
  if (copies > 1) {
    std::vector<torch::Tensor> shard{out};
    distributed::wait(replicas->allreduce(shard), std::string("hsdp all_reduce of unit '") +
                                                      u.name + "' gradient shards (" +
                                                      describe(out) + ")");
  }
  if (accumulate_)
    u.shard_grad.add_(out.to(u.shard_grad.device()));
  else if (!direct)
    u.shard_grad.copy_(out);  // into host memory under cpu_offload
  u.reduced = true;
  ++reduce_scatters_;
  release(u);
}

void ShardedParameters::begin_backward(bool sync, bool accumulate) {
  forward_order_ = std::move(used_now_);
  used_now_.clear();
  in_backward_ = true;
  sync_ = sync;
  accumulate_ = accumulate;
  for (auto& u : units_) {
    u.grads_ready = 0;
    u.reduced = false;
  }
}

void ShardedParameters::end_backward() {
  if (sync_)
    for (auto& u : units_)
      if (!u.frozen && !u.reduced) reduce(u);  // parameters without a gradient count as zeros
  for (auto& u : units_) release(u);
  in_backward_ = false;
  backward_order_ = std::move(used_now_);
  used_now_.clear();
}

void ShardedParameters::after_step() {
  for (auto& u : units_) release(u);
}

ScopeGuard ShardedParameters::materialize(bool write_back) {
  for (auto& u : units_) {
    ++u.pins;
    gather(u, /*exact=*/true);
  }
  return ScopeGuard([this, write_back] {
    torch::NoGradGuard no_grad;
    for (auto& u : units_) {
      if (write_back) u.shard.copy_(u.full.narrow(0, rank_ * u.shard_size, u.shard_size));
      --u.pins;
      release(u);
    }
  });
}

void ShardedParameters::gather_all_into_parameters() {
  torch::NoGradGuard no_grad;
  for (auto& u : units_) {
    gather(u, /*exact=*/true);
    Inside inside;
    for (size_t i = 0; i < u.params.size(); ++i) {
      torch::Tensor& p = u.params[i];
      p.set_(u.full.narrow(0, u.offsets[i], p.numel()).view(p.sizes()).clone());
    }
    unit_of_storage_.erase(u.full.storage().unsafeGetStorageImpl());
    u.pins = 0;
    release(u);
  }
}

void ShardedParameters::drop_to_meta() {
  torch::NoGradGuard no_grad;
  for (auto& u : units_) {
    {
      Inside inside;
      for (auto& p : u.params)
        replace_data(p, torch::empty(p.sizes(), p.options().device(c10::kMeta)));
    }
    unit_of_storage_.erase(u.full.storage().unsafeGetStorageImpl());
    u.pins = 0;
    release(u);
    u.shard = torch::Tensor();
    u.shard_grad = torch::Tensor();
  }
}

OptimizerShard::Segments ShardedParameters::segments() const {
  OptimizerShard::Segments s;
  std::unordered_map<const void*, std::pair<size_t, int64_t>> where;
  for (const Unit& u : units_) {
    if (u.frozen) continue;
    if (policy_.cpu_offload) s.collective_device = u.full.device();
    const size_t segment = s.memory.size();
    s.elements.push_back(u.total);
    s.shard_sizes.push_back(u.shard_size);
    s.memory.push_back(u.shard);
    s.grads.push_back(u.shard_grad);
    for (size_t i = 0; i < u.params.size(); ++i)
      where[u.params[i].unsafeGetTensorImpl()] = {segment, u.offsets[i]};
  }
  s.place = [where](const torch::Tensor& p) {
    auto it = where.find(p.unsafeGetTensorImpl());
    if (it == where.end())
      throw Error(std::string(kKey) +
                  ": the optimizer holds a tensor that is not a parameter of the module set up "
                  "with it (or one that does not require gradients)");
    return it->second;
  };
  return s;
}

std::vector<ShardedParameters::UnitInfo> ShardedParameters::units() const {
  std::vector<UnitInfo> out;
  for (const auto& u : units_) {
    int64_t elements = 0;
    for (const auto& p : u.params) elements += p.numel();
    out.push_back({u.name, u.root, u.frozen, elements, static_cast<int64_t>(u.params.size()),
                   world_ * u.shard_size});
  }
  return out;
}

namespace {

std::unique_ptr<at::ObserverContext> on_operator(const at::RecordFunction& fn) {
  if (t_inside) return nullptr;
  ShardedParameters* self = g_instance.load(std::memory_order_acquire);
  if (self != nullptr) self->on_operator_inputs(fn.inputs());
  return nullptr;
}

}  // namespace
}  // namespace fabric::strategies
