#include "strategies/optimizer_shard.h"

#include <ATen/native/TensorFactories.h>
#include <torch/optim.h>
#include <torch/types.h>

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "strategies/optimizer_shard_detail.h"

namespace fabric::strategies {
namespace {

using detail::alias;
using detail::describe;

using Dict = c10::impl::GenericDict;

bool elementwise(const torch::optim::Optimizer& o) {
  return dynamic_cast<const torch::optim::SGD*>(&o) ||
         dynamic_cast<const torch::optim::Adam*>(&o) ||
         dynamic_cast<const torch::optim::AdamW*>(&o) ||
         dynamic_cast<const torch::optim::RMSprop*>(&o) ||
         dynamic_cast<const torch::optim::Adagrad*>(&o);
}

}  // namespace

FlatLayout flat_layout(const std::vector<int64_t>& numels, int64_t element_size, int64_t world) {
  const int64_t align = std::max<int64_t>(1, 128 / std::max<int64_t>(element_size, 1));
  auto up = [](int64_t n, int64_t a) { return (n + a - 1) / a * a; };
  FlatLayout l;
  for (int64_t n : numels) {
    l.offsets.push_back(up(l.total, align));
    l.total = l.offsets.back() + n;
  }
  l.shard_size = up((l.total + world - 1) / world, align);
  if ((world - 1) * l.shard_size < l.total) return l;
  // A rank would get nothing: packed, as without alignment.
  FlatLayout packed;
  for (int64_t n : numels) {
    packed.offsets.push_back(packed.total);
    packed.total += n;
  }
  packed.shard_size = (packed.total + world - 1) / world;
  return packed;
}

void zero_gaps(torch::Tensor& flat, const std::vector<int64_t>& offsets,
               const std::vector<torch::Tensor>& tensors) {
  int64_t end = 0;
  for (size_t i = 0; i <= tensors.size(); ++i) {
    const int64_t next = i < tensors.size() ? offsets[i] : flat.numel();
    if (next > end) flat.narrow(0, end, next - end).zero_();
    if (i < tensors.size()) end = offsets[i] + tensors[i].numel();
  }
}

OptimizerShard::OptimizerShard(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::Tensor>& named,
                               const std::vector<std::string>& names,
                               c10::intrusive_ptr<c10d::ProcessGroup> pg)
    : optimizer_(optimizer), pg_(std::move(pg)), key_("fabric.ddp.shard_optimizer_state") {
  collect(named, names);
  std::set<const void*> storages;
  std::vector<int64_t> numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    auto fail = [&](const std::string& why) {
      throw error("parameter '" + names_[i] + "' " + why);
    };
    if (p.is_sparse() || !p.is_non_overlapping_and_dense())
      fail("is not dense in memory (a view or sparse tensor); sharding needs dense parameters");
    if (p.scalar_type() != params_[0].scalar_type() || p.device() != params_[0].device())
      fail("has dtype " + std::string(c10::toString(p.scalar_type())) + " on " + p.device().str() +
           ", the first has " + std::string(c10::toString(params_[0].scalar_type())) + " on " +
           params_[0].device().str() + "; sharding needs one dtype and device");
    if (!storages.insert(p.storage().unsafeGetStorageImpl()).second)
      fail("shares memory with another parameter (tied weights are not supported)");
    segment_of_.push_back(0);
    numels.push_back(p.numel());
  }
  const FlatLayout layout = flat_layout(numels, params_[0].element_size(), world_);
  offsets_ = layout.offsets;
  const int64_t total = layout.total;
  totals_ = {total};
  shard_sizes_ = {layout.shard_size};
  if ((world_ - 1) * shard_sizes_[0] >= total)
    throw error("the optimizer's parameters have " + std::to_string(total) +
                " elements, too few to give each of the " + std::to_string(world_) +
                " ranks a part; set " + key_ + ": false");
  grads_ = {torch::zeros({shard_sizes_[0]}, params_[0].options().requires_grad(false))};
  split({torch::Tensor()});
}

OptimizerShard::OptimizerShard(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::Tensor>& named,
                               const std::vector<std::string>& names,
                               c10::intrusive_ptr<c10d::ProcessGroup> pg, Segments segments,
                               std::string key)
    : optimizer_(optimizer), pg_(std::move(pg)), key_(std::move(key)) {
  collect(named, names);
  for (const auto& p : params_) {
    const auto [segment, offset] = segments.place(p);
    segment_of_.push_back(segment);
    offsets_.push_back(offset);
  }
  totals_ = segments.elements;
  shard_sizes_ = segments.shard_sizes;
  grads_ = std::move(segments.grads);
  collective_device_ = segments.collective_device;
  split(segments.memory);
}

void OptimizerShard::collect(const std::vector<torch::Tensor>& named,
                             const std::vector<std::string>& names) {
  rank_ = pg_->getRank();
  world_ = pg_->getSize();
  if (!elementwise(optimizer_))
    throw error(
        "the optimizer is not SGD, Adam, AdamW, RMSprop or Adagrad (sharding needs an "
        "optimizer that updates each element on its own)");
  if (!optimizer_.state().empty())
    throw error(
        "the optimizer has already stepped; pass it to Fabric::setup before its first step");
  std::unordered_map<const void*, std::string> name_of_impl;
  for (size_t i = 0; i < named.size() && i < names.size(); ++i)
    name_of_impl[named[i].unsafeGetTensorImpl()] = names[i];
  for (const auto& group : optimizer_.param_groups()) {
    group_params_.emplace_back();
    for (const auto& p : group.params()) {
      const size_t i = params_.size();
      auto it = name_of_impl.find(p.unsafeGetTensorImpl());
      names_.push_back(it != name_of_impl.end() ? it->second
                                                : "optimizer parameter #" + std::to_string(i));
      params_.push_back(p);
      group_params_.back().push_back(i);
      if (!p.requires_grad())
        throw error("parameter '" + names_.back() +
                    "' does not require gradients; leave it out of the optimizer");
    }
  }
  if (params_.empty()) throw error("the optimizer has no parameters");
}

void OptimizerShard::split(const std::vector<torch::Tensor>& memory) {
  // This rank's pieces, in parameter order (so group by group).
  std::vector<std::vector<torch::Tensor>> group_pieces(group_params_.size());
  for (size_t g = 0; g < group_params_.size(); ++g) {
    for (size_t i : group_params_[g]) {
      const size_t s = segment_of_[i];
      const int64_t lo = rank_ * shard_sizes_[s], hi = std::min(lo + shard_sizes_[s], totals_[s]);
      const int64_t a = offsets_[i], b = a + params_[i].numel();
      const int64_t x = std::max(a, lo), y = std::min(b, hi);
      if (x >= y) continue;
      pieces_.push_back({i, x - a, y - x, x - lo});
      piece_tensors_.push_back(memory[s].defined() ? alias(memory[s], x - lo, y - x)
                                                   : alias(params_[i], x - a, y - x));
      group_pieces[g].push_back(piece_tensors_.back());
    }
  }
  for (size_t g = 0; g < group_params_.size(); ++g)
    optimizer_.param_groups()[g].params() = group_pieces[g];
}

Error OptimizerShard::error(const std::string& what) const { return Error(key_ + ": " + what); }

OptimizerShard::~OptimizerShard() = default;

torch::Tensor OptimizerShard::flat_of(size_t param, const torch::Tensor& flat) const {
  const torch::Tensor& p = params_[param];
  return flat.narrow(0, offsets_[param], p.numel()).as_strided(p.sizes(), p.strides());
}

void OptimizerShard::attach_gradients() {
  for (size_t k = 0; k < pieces_.size(); ++k)
    piece_tensors_[k].mutable_grad() =
        alias(grads_[segment_of_[pieces_[k].param]], pieces_[k].shard_offset, pieces_[k].length);
}

bool OptimizerShard::has_gradients() const {
  return !piece_tensors_.empty() && piece_tensors_[0].grad().defined();
}

void OptimizerShard::reduce_scatter_gradients() {
  torch::Tensor& shard_grad = grads_.at(0);
  const int64_t shard_size = shard_sizes_.at(0);
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& grad = params_[i].grad();
    if (!grad.defined())
      throw Error("ddp: parameter '" + names_[i] + "' has no gradient after backward on rank " +
                  std::to_string(rank_) + "; " + key_ +
                  " needs a gradient for every parameter the optimizer holds in every step "
                  "(unused parameters are not supported with it)");
    if (grad.is_sparse()) throw Error("ddp: parameter '" + names_[i] + "' has a sparse gradient");
  }
  torch::NoGradGuard no_grad;
  torch::Tensor flat = torch::empty({world_ * shard_size}, shard_grad.options());
  zero_gaps(flat, offsets_, params_);  // the layout's gaps and padding
  // The Reducer's factor: a wrapped double scalar, the product computed in the gradient's dtype.
  const torch::Tensor inverse_world = at::native::wrapped_scalar_tensor(1.0 / world_);
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor slot = flat_of(i, flat);
    at::mul_out(slot, params_[i].grad(), inverse_world);
  }
  // The pieces hold a synchronized backward's gradients since zero_grad: this one adds to them, as
  // gradients accumulate under ddp (it overwrote them: a backward before this one was lost).
  const bool accumulate = has_gradients();
  torch::Tensor out = accumulate ? torch::empty_like(shard_grad) : shard_grad;
  distributed::wait(pg_->_reduce_scatter_base(out, flat),
                    "gradient reduce_scatter (" + describe(flat) + ")");
  if (accumulate) shard_grad.add_(out);
  for (auto& p : params_) p.mutable_grad().reset();
  attach_gradients();
}

void OptimizerShard::gather_parameters() {
  const torch::Tensor& shard_grad = grads_.at(0);
  const int64_t shard_size = shard_sizes_.at(0);
  torch::NoGradGuard no_grad;
  torch::Tensor send = torch::zeros({shard_size}, shard_grad.options());
  for (size_t k = 0; k < pieces_.size(); ++k)
    send.narrow(0, pieces_[k].shard_offset, pieces_[k].length).copy_(piece_tensors_[k]);
  torch::Tensor flat = torch::empty({world_ * shard_size}, send.options());
  distributed::wait(pg_->_allgather_base(flat, send),
                    "parameter all_gather (" + describe(flat) + ")");
  for (size_t i = 0; i < params_.size(); ++i)
    alias(params_[i], 0, params_[i].numel()).copy_(flat.narrow(0, offsets_[i], params_[i].numel()));
}

void OptimizerShard::set_norm_scope(c10::intrusive_ptr<c10d::ProcessGroup> group,
                                    const std::function<double(const torch::Tensor&)>& weight) {
  norm_pg_ = std::move(group);
  norm_weights_.clear();
  for (const auto& p : params_) norm_weights_.push_back(weight(p));
}

torch::Tensor OptimizerShard::clip_grad_norm(double max_norm, double norm_type) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  std::vector<double> weights;
  for (size_t k = 0; k < piece_tensors_.size(); ++k) {
    if (!piece_tensors_[k].grad().defined()) continue;
    grads.push_back(piece_tensors_[k].grad());
    weights.push_back(norm_weights_.empty() ? 1.0 : norm_weights_[pieces_[k].param]);
  }
  const auto options = grads_.at(0).options();
  torch::Tensor total;
  if (norm_type == 0) {  // LibTorch's count of gradients, over the whole model
    total = torch::full({}, static_cast<double>(params_.size()),
                        torch::TensorOptions().device(options.device()));
  } else {
    const bool inf = norm_type == std::numeric_limits<double>::infinity();
    torch::Tensor local = torch::zeros({1}, options);
    for (size_t i = 0; i < grads.size(); ++i) {
      const torch::Tensor& g = grads[i];
      if (inf) {
        local = torch::maximum(local, g.abs().max().reshape({1}));
      } else if (weights[i] == 1.0) {
        local.add_(g.norm(norm_type).pow(norm_type).reshape({1}));
      } else {
        local.add_(g.norm(norm_type).pow(norm_type).reshape({1}), weights[i]);
      }
    }
    std::vector<torch::Tensor> v = {local.to(collective_device())};
    c10d::AllreduceOptions o;
    o.reduceOp = inf ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    distributed::wait((norm_pg_ ? norm_pg_ : pg_)->allreduce(v, o), "gradient norm all_reduce");
    local = v[0].to(local.device());
    total = (inf ? local : local.pow(1.0 / norm_type)).reshape({});
  }
  const torch::Tensor coefficient =
      torch::clamp(max_norm / (total + 1e-6), /*min=*/std::nullopt, /*max=*/1.0);
  for (auto& g : grads) g.mul_(coefficient);
  return total;
}

void OptimizerShard::clip_grad_value(double clip_value) {
  torch::NoGradGuard no_grad;
  for (const auto& t : piece_tensors_)
    if (t.grad().defined()) t.grad().clamp_(-clip_value, clip_value);
}

}  // namespace fabric::strategies
