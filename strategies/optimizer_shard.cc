#include "strategies/optimizer_shard.h"

#include <ATen/native/TensorFactories.h>
#include <torch/optim.h>
#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <set>
#include <unordered_map>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"

namespace fabric::strategies {
namespace {

using Dict = c10::impl::GenericDict;

// `length` elements of `t`'s memory from its first element + `begin`, as a 1-D tensor of its own
// (no autograd view relation: Optimizer::zero_grad may detach_() it).
torch::Tensor alias(const torch::Tensor& t, int64_t begin, int64_t length) {
  torch::NoGradGuard no_grad;
  return torch::empty({0}, t.options())
      .set_(t.storage(), t.storage_offset() + begin, {length}, {1});
}

bool elementwise(const torch::optim::Optimizer& o) {
  return dynamic_cast<const torch::optim::SGD*>(&o) ||
         dynamic_cast<const torch::optim::Adam*>(&o) ||
         dynamic_cast<const torch::optim::AdamW*>(&o) ||
         dynamic_cast<const torch::optim::RMSprop*>(&o) ||
         dynamic_cast<const torch::optim::Adagrad*>(&o);
}

std::string describe(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " [" + std::to_string(t.numel()) + "]";
}

// Every rank's `value` agrees: [min, max] over the ranks.
std::pair<int64_t, int64_t> min_max(c10d::ProcessGroup& pg, int64_t value,
                                    const torch::Device& device, const std::string& what) {
  auto lo = torch::tensor({value}, torch::dtype(torch::kLong)).to(device);
  auto hi = lo.clone();
  std::vector<torch::Tensor> a = {lo}, b = {hi};
  c10d::AllreduceOptions min_opts, max_opts;
  min_opts.reduceOp = c10d::ReduceOp::MIN;
  max_opts.reduceOp = c10d::ReduceOp::MAX;
  distributed::wait(pg.allreduce(a, min_opts), what + " all_reduce(min)");
  distributed::wait(pg.allreduce(b, max_opts), what + " all_reduce(max)");
  return {lo.item<int64_t>(), hi.item<int64_t>()};
}

// The per-parameter fields of this rank's optimizer state (its first piece's: every piece steps
// in every step, so every piece has the same fields and step count): buffers (their dtypes) and
// scalars ("step" and non-tensors), copied to every parameter.
struct PieceFields {
  explicit PieceFields(const Dict& state) {
    if (state.size() == 0) return;
    for (const auto& e : state.at(int64_t{0}).toGenericDict()) {
      if (e.value().isTensor() && e.key().toStringRef() != "step") {
        fields.push_back(e.key().toStringRef());
        dtypes.push_back(e.value().toTensor().scalar_type());
      } else {
        scalars.insert(e.key(), e.value());
      }
    }
  }
  std::vector<std::string> fields;
  std::vector<torch::ScalarType> dtypes;
  Dict scalars{c10::StringType::get(), c10::AnyType::get()};
};

}  // namespace

OptimizerShard::OptimizerShard(torch::optim::Optimizer& optimizer,
                               const std::vector<torch::Tensor>& named,
                               const std::vector<std::string>& names,
                               c10::intrusive_ptr<c10d::ProcessGroup> pg)
    : optimizer_(optimizer), pg_(std::move(pg)), key_("fabric.ddp.shard_optimizer_state") {
  collect(named, names);
  std::set<const void*> storages;
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    auto fail = [&](const std::string& why) {
      throw error("parameter '" + names_[i] + "' " + why);
    };
    if (p.is_sparse() || !p.is_non_overlapping_and_dense())
      fail("is not dense in memory (a view or sparse tensor); sharding needs dense parameters");
    if (p.scalar_type() != params_[0].scalar_type() || p.device() != params_[0].device())
      fail("has dtype " + std::string(c10::toString(p.scalar_type())) + " on " +
           p.device().str() + ", the first has " +
           std::string(c10::toString(params_[0].scalar_type())) + " on " +
           params_[0].device().str() + "; sharding needs one dtype and device");
    if (!storages.insert(p.storage().unsafeGetStorageImpl()).second)
      fail("shares memory with another parameter (tied weights are not supported)");
    segment_of_.push_back(0);
    offsets_.push_back(total);
    total += p.numel();
  }
  totals_ = {total};
  shard_sizes_ = {(total + world_ - 1) / world_};
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
  for (int64_t t : totals_) shard_sizes_.push_back((t + world_ - 1) / world_);
  grads_ = std::move(segments.grads);
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
    piece_tensors_[k].mutable_grad() = alias(grads_[segment_of_[pieces_[k].param]],
                                             pieces_[k].shard_offset, pieces_[k].length);
}

bool OptimizerShard::has_gradients() const {
  return !piece_tensors_.empty() && piece_tensors_[0].grad().defined();
}

void OptimizerShard::reduce_scatter_gradients() {
  torch::Tensor& shard_grad = grads_.at(0);
  const int64_t total = totals_.at(0), shard_size = shard_sizes_.at(0);
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
  if (world_ * shard_size > total) flat.narrow(0, total, world_ * shard_size - total).zero_();
  // The Reducer's factor: a wrapped double scalar, the product computed in the gradient's dtype.
  const torch::Tensor inverse_world = at::native::wrapped_scalar_tensor(1.0 / world_);
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor slot = flat_of(i, flat);
    at::mul_out(slot, params_[i].grad(), inverse_world);
  }
  distributed::wait(pg_->_reduce_scatter_base(shard_grad, flat),
                    "gradient reduce_scatter (" + describe(flat) + ")");
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

torch::Tensor OptimizerShard::clip_grad_norm(double max_norm, double norm_type) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& t : piece_tensors_)
    if (t.grad().defined()) grads.push_back(t.grad());
  const auto options = grads_.at(0).options();
  torch::Tensor total;
  if (norm_type == 0) {  // LibTorch's count of gradients, over the whole model
    total = torch::full({}, static_cast<double>(params_.size()),
                        torch::TensorOptions().device(options.device()));
  } else {
    const bool inf = norm_type == std::numeric_limits<double>::infinity();
    torch::Tensor local = torch::zeros({1}, options);
    for (const auto& g : grads) {
      if (inf) {
        local = torch::maximum(local, g.abs().max().reshape({1}));
      } else {
        local.add_(g.norm(norm_type).pow(norm_type).reshape({1}));
      }
    }
    std::vector<torch::Tensor> v = {local};
    c10d::AllreduceOptions o;
    o.reduceOp = inf ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    distributed::wait(pg_->allreduce(v, o), "gradient norm all_reduce");
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

c10::IValue OptimizerShard::one_process_layout(const c10::impl::GenericDict& local,
                                               const c10::impl::GenericDict& state) const {
  c10::impl::GenericList groups(c10::AnyType::get());
  const auto local_groups = local.at("param_groups").toList();
  for (size_t g = 0; g < group_params_.size(); ++g) {
    Dict group(c10::StringType::get(), c10::AnyType::get());
    for (const auto& e : local_groups.get(g).toGenericDict())
      if (e.key().toStringRef() != "params") group.insert(e.key(), e.value());
    c10::impl::GenericList ids(c10::AnyType::get());
    for (size_t i : group_params_[g]) ids.push_back(static_cast<int64_t>(i));
    group.insert("params", ids);
    groups.push_back(group);
  }
  Dict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("type", local.at("type"));
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

c10::IValue OptimizerShard::full_state() {
  const Dict local = optimizer_state(optimizer_).toGenericDict();
  const Dict state = local.at("state").toGenericDict();
  const std::string what = key_ + " checkpoint";
  if (state.size() != 0 && state.size() != pieces_.size())
    throw Error(what + ": " + std::to_string(state.size()) + " of this rank's " +
                std::to_string(pieces_.size()) + " parameter pieces have optimizer state");
  const PieceFields piece_fields(state);
  const auto& [fields, dtypes, scalars] = piece_fields;
  const torch::Device device = grads_.at(0).device();
  const auto [lo, hi] =
      min_max(*pg_, static_cast<int64_t>(fields.size()) * 2 + (state.size() > 0), device, what);
  if (lo != hi)
    throw Error(what +
                ": the ranks hold different kinds of optimizer state (some stepped, some "
                "not); every rank must step the optimizer in the same steps");

  std::vector<Dict> per_param;
  for (size_t i = 0; i < params_.size(); ++i) {
    per_param.emplace_back(c10::StringType::get(), c10::AnyType::get());
    for (const auto& e : scalars) per_param.back().insert(e.key(), e.value());
  }
  for (size_t f = 0; f < fields.size(); ++f) {
    for (size_t s = 0; s < totals_.size(); ++s) {
      torch::Tensor send =
          torch::zeros({shard_sizes_[s]}, torch::dtype(dtypes[f]).device(device));
      for (size_t k = 0; k < pieces_.size(); ++k) {
        if (segment_of_[pieces_[k].param] != s) continue;
        const torch::Tensor t =
            state.at(static_cast<int64_t>(k)).toGenericDict().at(fields[f]).toTensor();
        send.narrow(0, pieces_[k].shard_offset, pieces_[k].length).copy_(t.reshape(-1));
      }
      torch::Tensor flat = torch::empty({world_ * shard_sizes_[s]}, send.options());
      distributed::wait(pg_->_allgather_base(flat, send),
                        what + " all_gather of '" + fields[f] + "' (" + describe(flat) + ")");
      for (size_t i = 0; i < params_.size(); ++i)
        if (segment_of_[i] == s) per_param[i].insert(fields[f], flat_of(i, flat).clone());
    }
  }

  Dict out_state(c10::IntType::get(), c10::AnyType::get());
  if (state.size() > 0)
    for (size_t i = 0; i < params_.size(); ++i)
      out_state.insert(static_cast<int64_t>(i), per_param[i]);
  return one_process_layout(local, out_state);
}

c10::IValue OptimizerShard::local_state() const {
  const Dict local = optimizer_state(optimizer_).toGenericDict();
  const Dict state = local.at("state").toGenericDict();
  // Rank 0 always holds the first elements of every segment: its fields are every parameter's.
  const PieceFields piece_fields(state);
  const auto& [fields, dtypes, scalars] = piece_fields;
  std::vector<int64_t> piece_of(params_.size(), -1);
  for (size_t k = 0; k < pieces_.size(); ++k) piece_of[pieces_[k].param] = static_cast<int64_t>(k);
  Dict out_state(c10::IntType::get(), c10::AnyType::get());
  if (state.size() > 0) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Dict s(c10::StringType::get(), c10::AnyType::get());
      for (const auto& e : scalars) s.insert(e.key(), e.value());
      const torch::Tensor& p = params_[i];
      for (size_t f = 0; f < fields.size(); ++f) {
        const int64_t k = piece_of[i];
        torch::Tensor values = torch::empty({0}, torch::dtype(dtypes[f]));
        int64_t begin = 0;
        if (k >= 0 && state.contains(k)) {
          values = state.at(k).toGenericDict().at(fields[f]).toTensor();
          begin = pieces_[k].begin;
        }
        s.insert(fields[f], tensor_piece(p.sizes(), p.strides(), begin, values));
      }
      out_state.insert(static_cast<int64_t>(i), s);
    }
  }
  return one_process_layout(local, out_state);
}

std::function<void()> OptimizerShard::prepare_full_state(const c10::IValue& value,
                                                         const std::string& source) {
  auto fail = [&](const std::string& why) -> std::function<void()> {
    throw Error(source + ": does not match the optimizer: " + why);
  };
  if (!value.isGenericDict()) return fail("not an optimizer state");
  const Dict dict = value.toGenericDict();
  if (!dict.contains("state") || !dict.at("state").isGenericDict() ||
      !dict.contains("param_groups") || !dict.at("param_groups").isList() || !dict.contains("type"))
    return fail("malformed optimizer state");
  const Dict state = dict.at("state").toGenericDict();
  const auto groups = dict.at("param_groups").toList();
  if (groups.size() != group_params_.size())
    return fail(std::to_string(groups.size()) + " parameter groups, the optimizer has " +
                std::to_string(group_params_.size()));
  std::vector<size_t> group_of(params_.size());
  for (size_t g = 0; g < group_params_.size(); ++g) {
    const c10::IValue group = groups.get(g);
    if (!group.isGenericDict() || !group.toGenericDict().contains("params") ||
        !group.toGenericDict().at("params").isList())
      return fail("malformed parameter group " + std::to_string(g));
    const size_t n = group.toGenericDict().at("params").toList().size();
    if (n != group_params_[g].size())
      return fail("group " + std::to_string(g) + " has " + std::to_string(n) +
                  " parameters, the optimizer's has " + std::to_string(group_params_[g].size()));
    for (size_t i : group_params_[g]) group_of[i] = g;
  }

  Dict piece_state(c10::IntType::get(), c10::AnyType::get());
  std::vector<c10::impl::GenericList> piece_ids(group_params_.size(),
                                                c10::impl::GenericList(c10::AnyType::get()));
  for (size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& piece = pieces_[k];
    piece_ids[group_of[piece.param]].push_back(static_cast<int64_t>(k));
    auto it = state.find(static_cast<int64_t>(piece.param));
    if (it == state.end()) continue;
    if (!it->value().isGenericDict())
      return fail("malformed state of '" + names_[piece.param] + "'");
    Dict s(c10::StringType::get(), c10::AnyType::get());
    const torch::Tensor& p = params_[piece.param];
    for (const auto& e : it->value().toGenericDict()) {
      if (!e.key().isString()) return fail("malformed state of '" + names_[piece.param] + "'");
      if (e.value().isTensor() && e.key().toStringRef() != "step") {
        const torch::Tensor t = e.value().toTensor();
        if (t.numel() != p.numel())
          return fail("'" + e.key().toStringRef() + "' of '" + names_[piece.param] + "' has " +
                      std::to_string(t.numel()) + " elements, the parameter has " +
                      std::to_string(p.numel()));
        // The parameter's memory order, then this piece's elements.
        torch::Tensor laid = torch::empty_strided(p.sizes(), p.strides(), t.options());
        laid.copy_(t.reshape(p.sizes()));
        s.insert(e.key(), alias(laid, piece.begin, piece.length).clone());
      } else {
        s.insert(e.key(), e.value());
      }
    }
    piece_state.insert(static_cast<int64_t>(k), s);
  }
  c10::impl::GenericList piece_groups(c10::AnyType::get());
  for (size_t g = 0; g < group_params_.size(); ++g) {
    Dict group(c10::StringType::get(), c10::AnyType::get());
    for (const auto& e : groups.get(g).toGenericDict())
      if (e.key().toStringRef() != "params") group.insert(e.key(), e.value());
    group.insert("params", piece_ids[g]);
    piece_groups.push_back(group);
  }
  Dict out(c10::StringType::get(), c10::AnyType::get());
  out.insert("type", dict.at("type"));
  out.insert("state", piece_state);
  out.insert("param_groups", piece_groups);
  return prepare_optimizer_state(optimizer_, out, source);
}

}  // namespace fabric::strategies
