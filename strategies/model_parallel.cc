#include "strategies/model_parallel.h"

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <iostream>
#include <memory>

#include "fabric/checkpoint/piece_layout.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/distributed/device_mesh.h"
#include "fabric/distributed/rendezvous.h"
#include "fabric/nn/empty_init.h"
#include "strategies/optimizer_shard.h"

namespace fabric::strategies {

ModelParallel::ModelParallel(std::shared_ptr<ClusterEnvironment> environment, torch::Device device,
                             std::unique_ptr<Precision> precision, const DdpOptions& ddp,
                             FsdpOptions fsdp, ModelParallelOptions options,
                             std::vector<std::string> argv)
    : Fsdp(std::move(environment), device, std::move(precision), ddp, std::move(fsdp),
           std::move(argv)),
      options_mp_(options) {
  key_ = "fabric.strategy: model_parallel";
}

ModelParallel::~ModelParallel() = default;

Error ModelParallel::unsupported(const std::string& what) const {
  return Error(key_ + ": " + what);
}

int64_t ModelParallel::data_parallel_rank() const {
  return global_rank() / options_mp_.tensor_parallel_size;
}

int64_t ModelParallel::tp_rank() const { return global_rank() % options_mp_.tensor_parallel_size; }

int64_t ModelParallel::replica() const {
  return global_rank() / (world_size() / options_mp_.replicate_size);
}

c10::intrusive_ptr<c10d::ProcessGroup> ModelParallel::replicate_group() const {
  if (!mesh_ || options_mp_.replicate_size == 1) return {};
  return mesh_->group("dp_replicate");
}

void ModelParallel::setup_environment() {
  Fsdp::setup_environment();
  const int64_t tp = options_mp_.tensor_parallel_size, dp = options_mp_.data_parallel_size;
  if (tp * dp != world_size())
    throw Error(key_ + ": fabric.model_parallel.data_parallel_size " + std::to_string(dp) +
                " x tensor_parallel_size " + std::to_string(tp) + " is not the world size " +
                std::to_string(world_size()));
  const int64_t copies = options_mp_.replicate_size;
  std::vector<distributed::MeshDim> dims{{"dp_shard", dp / copies}, {"tp", tp}};
  if (copies > 1) dims.insert(dims.begin(), {"dp_replicate", copies});
  mesh_ = std::make_unique<distributed::DeviceMesh>(rendezvous()->store(),
                                                    rendezvous()->group_options(), dims);
}

const c10::intrusive_ptr<c10d::ProcessGroup>& ModelParallel::data_parallel_group(
    const std::string& what) const {
  if (!mesh_) return group_for(what);  // throws before setup_environment
  return mesh_->group("dp_shard");
}

void ModelParallel::setup_module(torch::nn::Module& module) {
  if (!mesh_) group_for("setup_module");  // names the missing setup_environment
  if (split_module_ != nullptr)
    throw unsupported("splits one module per process; this job set up a second one");
  fabric::nn::TensorParallelPlan plan;
  if (plan_) {
    plan = *plan_;
  } else if (const auto* planned =
                 dynamic_cast<const fabric::nn::TensorParallelPlanned*>(&module)) {
    plan = planned->tensor_parallel_plan();
  } else {
    throw unsupported("the module (" + module.name() +
                      ") carries no tensor-parallel plan: derive it from "
                      "fabric::nn::TensorParallelPlanned, or give one to "
                      "ModelParallel::set_plan (docs/training.md, \"Tensor parallelism\")");
  }
  plan.sequence_parallel = plan.sequence_parallel || options_mp_.sequence_parallel;
  if (!fabric::has_meta_tensors(module)) {
    // Rank 0's values everywhere before they are cut (fsdp then spreads each slice over its
    // dp_shard group); an empty init's are the same everywhere by construction (Fsdp replays
    // from rank 0's generator, initial_value cuts them).
    module.to(device_);
    std::vector<torch::Tensor> state = module.parameters();
    for (const auto& b : module.buffers()) state.push_back(b);
    torch::NoGradGuard no_grad;
    c10d::broadcast_coalesced(process_group(), state, 250 * 1024 * 1024, 0);
  }
  const std::vector<std::string> split = fabric::nn::parallelize(module, plan, mesh_->group("tp"));
  split_module_ = &module;
  try {  // a module owned by a shared_ptr (every ModuleHolder's) may be gone by teardown
    owner_ = module.shared_from_this();
    owned_ = true;
  } catch (const std::bad_weak_ptr&) {
    owned_ = false;
  }
  std::vector<std::pair<std::string, torch::nn::Module*>> all = {{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    all.emplace_back(item.key(), item.value().get());
  for (const auto& [name, m] : all) {
    const std::string prefix = name.empty() ? "" : name + ".";
    if (auto* l = m->as<fabric::nn::LinearImpl>(); l != nullptr && l->parallel()) {
      const auto& p = *l->parallel();
      module_splits_.emplace(prefix + "weight", Split{p, p.dim, p.full_sizes});
      if (l->bias.defined() && p.dim == 0)
        module_splits_.emplace(prefix + "bias", Split{p, 0, {p.full_sizes[0]}});
    } else if (auto* e = m->as<fabric::nn::EmbeddingImpl>(); e != nullptr && e->parallel()) {
      const auto& p = *e->parallel();
      module_splits_.emplace(prefix + "weight", Split{p, 0, p.full_sizes});
    }
  }
  const auto named = module.named_parameters();
  for (const auto& [name, split] : module_splits_)
    split_of_tensor_[named[name].unsafeGetTensorImpl()] = &split;
  if (global_rank() == 0)
    std::cerr << name() << ": " << mesh_->describe() << ", " << split.size()
              << (split.size() == 1 ? " module" : " modules") << " split over tp"
              << (plan.sequence_parallel ? ", sequence parallel" : "") << std::endl;
  Fsdp::setup_module(module);
}

torch::Tensor ModelParallel::initial_value(const torch::Tensor& held, const torch::Tensor& value) {
  auto it = split_of_tensor_.find(held.unsafeGetTensorImpl());
  if (it == split_of_tensor_.end()) return value;
  return it->second->shard.slice(value, it->second->along).contiguous();
}

void ModelParallel::setup_optimizer(torch::optim::Optimizer& optimizer) {
  // Each of the optimizer's parameters (in its order, as checkpoints number them): split or not.
  std::map<const void*, const Split*> by_tensor;
  const auto named = split_module_ != nullptr ? split_module_->named_parameters()
                                              : torch::OrderedDict<std::string, torch::Tensor>();
  for (const auto& [name, split] : module_splits_)
    by_tensor[named[name].unsafeGetTensorImpl()] = &split;
  optimizer_splits_.clear();
  for (const auto& group : optimizer.param_groups())
    for (const auto& p : group.params()) {
      auto it = by_tensor.find(p.unsafeGetTensorImpl());
      optimizer_splits_.push_back(it == by_tensor.end() ? std::nullopt
                                                        : std::optional<Split>(*it->second));
    }
  Fsdp::setup_optimizer(optimizer);
  // Over the world each element of a shard is counted once per copy (HSDP), and a tensor not
  // split over tp once per tp rank too.
  const double tp = static_cast<double>(options_mp_.tensor_parallel_size);
  const double copies = static_cast<double>(options_mp_.replicate_size);
  torch::nn::Module& module = *split_module_;
  shard_->set_norm_scope(process_group(), [&](const torch::Tensor& p) {
    return (fabric::nn::is_split_parameter(module, p) ? 1.0 : 1.0 / tp) / copies;
  });
}

torch::Tensor ModelParallel::clip_gradients_norm(const std::vector<torch::Tensor>& parameters,
                                                 torch::optim::Optimizer& optimizer,
                                                 double max_norm, double norm_type) {
  if (shard_of(optimizer) == nullptr)
    throw unsupported("clip_gradients of an optimizer that was not set up with the module");
  return Fsdp::clip_gradients_norm(parameters, optimizer, max_norm, norm_type);
}

ScopeGuard ModelParallel::materialize_parameters(torch::nn::Module& module, bool write_back) {
  if (&module != split_module_) return Fsdp::materialize_parameters(module, write_back);
  auto fsdp_whole = std::make_shared<ScopeGuard>(Fsdp::materialize_parameters(module, write_back));
  struct Held {
    torch::Tensor param, slice;
    const Split* split;
  };
  std::vector<Held> held;
  torch::NoGradGuard no_grad;
  const auto params = module.named_parameters();
  for (const auto& [name, split] : module_splits_) {
    torch::Tensor p = params[name];
    held.push_back({p, p.detach(), &split});
    p.set_data(split.shard.gather(p.detach(), split.along));
  }
  return ScopeGuard([held, fsdp_whole, write_back]() mutable {
    torch::NoGradGuard no_grad;
    for (Held& h : held) {
      if (write_back) h.slice.copy_(h.split->shard.slice(h.param.detach(), h.split->along));
      h.param.set_data(h.slice);
    }
    fsdp_whole.reset();  // fsdp takes the slices' values back into its shards
  });
}

ParameterParts ModelParallel::parameter_parts(torch::nn::Module& module) {
  ParameterParts out = Fsdp::parameter_parts(module);
  if (&module != split_module_) return out;
  // A tp-split parameter's part: fsdp's run of this rank's slice, placed among the whole
  // tensor's elements in the slices' order; gathered over dp_shard (fsdp), then over tp.
  std::vector<const Split*> splits;
  for (ParameterPart& part : out.parts) {
    auto it = module_splits_.find(part.name);
    splits.push_back(it == module_splits_.end() ? nullptr : &it->second);
    part.written = replica() == 0;  // HSDP: the other copies hold the same parts
    if (it == module_splits_.end()) {
      part.written = part.written && tp_rank() == 0;  // the tp ranks hold the same fsdp part
      continue;
    }
    const Split& s = it->second;
    if (!part.split)
      throw unsupported(
          "state kept per parameter beside the optimizer (callbacks.ema) of a "
          "split parameter without gradients (" +
          part.name + ") is not supported; set requires_grad or leave it out of the plan");
    const int64_t slice_numel = c10::multiply_integers(s.whole_sizes) / s.shard.size;
    part.offset += s.shard.rank * slice_numel;
    part.sizes = s.whole_sizes;
    part.layout = slices_layout(s.whole_sizes, s.along, s.shard.style.parts, s.shard.size);
  }
  auto slice = out.gather;  // fsdp's: this rank's whole slice
  out.gather = [slice, splits](const torch::Tensor& part, size_t i) {
    torch::Tensor t = slice(part, i);
    if (i < splits.size() && splits[i] != nullptr) t = splits[i]->shard.gather(t, splits[i]->along);
    return t;
  };
  return out;
}

std::optional<c10::IValue> ModelParallel::local_module_state(torch::nn::Module& module) {
  std::optional<c10::IValue> local = Fsdp::local_module_state(module);
  if (&module != split_module_ || !local || !local->isGenericDict()) return local;
  const auto dict = local->toGenericDict();
  c10::impl::GenericDict out(dict.keyType(), dict.valueType());
  for (const auto& item : dict) {
    auto it = item.key().isString() ? module_splits_.find(item.key().toStringRef())
                                    : module_splits_.end();
    out.insert(item.key(),
               whole_piece(item.value(), it == module_splits_.end() ? nullptr : &it->second));
  }
  return out;
}

std::optional<c10::IValue> ModelParallel::local_optimizer_state(
    torch::optim::Optimizer& optimizer) {
  std::optional<c10::IValue> local = Fsdp::local_optimizer_state(optimizer);
  if (!local || shard_of(optimizer) == nullptr) return local;
  return map_split_fields(*local, [this](const c10::IValue& v, const Split* s) {
    return as_tensor_piece(v) ? whole_piece(v, s) : v;
  });
}

c10::IValue ModelParallel::map_split_fields(const c10::IValue& layout, const FieldMap& map) const {
  const auto dict = layout.toGenericDict();
  c10::impl::GenericDict out(dict.keyType(), dict.valueType());
  for (const auto& item : dict) {
    if (!(item.key().isString() && item.key().toStringRef() == "state")) {
      out.insert(item.key(), item.value());
      continue;
    }
    const auto state = item.value().toGenericDict();
    c10::impl::GenericDict mapped(state.keyType(), state.valueType());
    for (const auto& entry : state) {
      const int64_t index = entry.key().toInt();
      const bool split = index >= 0 && index < static_cast<int64_t>(optimizer_splits_.size()) &&
                         optimizer_splits_[index].has_value();
      if (!entry.value().isGenericDict()) {
        mapped.insert(entry.key(), entry.value());
        continue;
      }
      const Split* s = split ? &*optimizer_splits_[index] : nullptr;
      const auto fields = entry.value().toGenericDict();
      c10::impl::GenericDict cut(fields.keyType(), fields.valueType());
      for (const auto& f : fields) cut.insert(f.key(), map(f.value(), s));
      mapped.insert(entry.key(), cut);
    }
    out.insert(item.key(), mapped);
  }
  return out;
}

c10::IValue ModelParallel::map_split_buffers(const c10::IValue& layout, bool gather) const {
  return map_split_fields(
      layout, [this, gather](const c10::IValue& v, const Split* split) -> c10::IValue {
        // A buffer shaped like a split parameter (not a scalar such as "step").
        if (split == nullptr) return v;
        const Split& s = *split;
        if (!gather && as_tensor_piece(v)) return piece_of_slice(v, s);  // run_of_slice's
        if (!v.isTensor() || v.toTensor().dim() != static_cast<int64_t>(s.whole_sizes.size()) ||
            v.toTensor().dim() == 0)
          return v;
        const torch::Tensor t = v.toTensor();
        if (gather) return s.shard.gather(t, s.along);
        if (t.sizes().vec() == s.whole_sizes) return s.shard.slice(t, s.along).contiguous();
        return v;
      });
}

c10::IValue ModelParallel::whole_piece(const c10::IValue& v, const Split* split) const {
  const bool first_copy = replica() == 0;  // HSDP: the other copies hold the same pieces
  if (split == nullptr) {
    // Not split over tp: every tp rank holds the same fsdp piece; the first writes it.
    auto piece = as_tensor_piece(v);
    if (!piece || (tp_rank() == 0 && first_copy)) return v;
    return tensor_piece(piece->sizes, piece->strides, piece->offset, piece->values.new_empty({0}));
  }
  const Split& s = *split;
  // Rank r's slice is the r-th run of the tensor in slices_layout's order; fsdp's piece of the
  // slice a run inside it.
  const int64_t slice_numel = c10::multiply_integers(s.whole_sizes) / s.shard.size;
  const auto layout = slices_layout(s.whole_sizes, s.along, s.shard.style.parts, s.shard.size);
  const auto strides = c10::contiguous_strides(s.whole_sizes);
  const int64_t base = s.shard.rank * slice_numel;
  if (auto piece = as_tensor_piece(v))
    return tensor_piece(s.whole_sizes, strides, base + piece->offset,
                        first_copy ? piece->values : piece->values.new_empty({0}), layout);
  if (!v.isTensor() || v.toTensor().numel() != slice_numel) return v;
  // A slice fsdp does not shard (no gradient) is held by every dp rank: the first writes it.
  const torch::Tensor t = v.toTensor();
  return tensor_piece(s.whole_sizes, strides, base,
                      data_parallel_rank() == 0 ? t : t.new_empty({0}), layout);
}

std::optional<c10::IValue> ModelParallel::gather_optimizer_state(
    torch::optim::Optimizer& optimizer) {
  std::optional<c10::IValue> state = Fsdp::gather_optimizer_state(optimizer);
  if (!state || shard_of(optimizer) == nullptr) return state;
  torch::NoGradGuard no_grad;
  return map_split_buffers(*state, /*gather=*/true);
}

std::vector<int64_t> ModelParallel::slice_sizes(const Split& s) {
  std::vector<int64_t> sizes = s.whole_sizes;
  sizes[s.along] /= s.shard.size;
  return sizes;
}

std::optional<PieceRange> ModelParallel::run_of_slice(
    const Split& s, at::IntArrayRef sizes, at::IntArrayRef strides,
    const std::optional<PieceLayout>& layout,
    const std::function<std::optional<PieceRange>(at::IntArrayRef)>& inner) const {
  // Only where the checkpoint lays the slices out as this job cuts them (the same tp size, or a
  // cut along the first dimension at any) is this rank's slice one run of it.
  const auto cut = slices_layout(s.whole_sizes, s.along, s.shard.style.parts, s.shard.size);
  const bool same =
      !sizes.equals(s.whole_sizes)                      ? false
      : !strides.equals(c10::contiguous_strides(sizes)) ? false
      : layout.has_value() != cut.has_value()
          ? false
          : !layout || (layout->shape == cut->shape && layout->permute == cut->permute);
  if (!same) return std::nullopt;  // read whole, cut here
  const std::optional<PieceRange> in_slice = inner(slice_sizes(s));
  if (!in_slice) return std::nullopt;
  const int64_t slice_numel = c10::multiply_integers(s.whole_sizes) / s.shard.size;
  return PieceRange{s.shard.rank * slice_numel + in_slice->offset, in_slice->count};
}

c10::IValue ModelParallel::piece_of_slice(const c10::IValue& v, const Split& s) const {
  auto piece = as_tensor_piece(v);
  if (!piece) return v;
  const int64_t slice_numel = c10::multiply_integers(s.whole_sizes) / s.shard.size;
  const auto sizes = slice_sizes(s);
  return tensor_piece(sizes, c10::contiguous_strides(sizes),
                      piece->offset - s.shard.rank * slice_numel, piece->values);
}

std::optional<PieceRange> ModelParallel::wanted_module_piece(
    const torch::nn::Module& module, const std::string& path, at::IntArrayRef sizes,
    at::IntArrayRef strides, const std::optional<PieceLayout>& layout) {
  auto it = &module == split_module_ ? module_splits_.find(path) : module_splits_.end();
  if (it == module_splits_.end())
    return Fsdp::wanted_module_piece(module, path, sizes, strides, layout);
  return run_of_slice(it->second, sizes, strides, layout, [&](at::IntArrayRef slice) {
    return Fsdp::wanted_module_piece(module, path, slice, c10::contiguous_strides(slice),
                                     std::nullopt);
  });
}

std::optional<PieceRange> ModelParallel::wanted_optimizer_piece(
    const torch::optim::Optimizer& optimizer, const std::string& path, at::IntArrayRef sizes,
    at::IntArrayRef strides, const std::optional<PieceLayout>& layout) {
  if (shard_of(optimizer) != nullptr && path.rfind("state/", 0) == 0) {
    const size_t end = path.find('/', 6);
    const int64_t index = std::stoll(path.substr(6, end - 6));
    if (index >= 0 && index < static_cast<int64_t>(optimizer_splits_.size()) &&
        optimizer_splits_[index].has_value())
      return run_of_slice(
          *optimizer_splits_[index], sizes, strides, layout, [&](at::IntArrayRef slice) {
            return Fsdp::wanted_optimizer_piece(optimizer, path, slice,
                                                c10::contiguous_strides(slice), std::nullopt);
          });
  }
  return Fsdp::wanted_optimizer_piece(optimizer, path, sizes, strides, layout);
}

std::optional<std::function<void()>> ModelParallel::prepare_local_module_state(
    torch::nn::Module& module, const c10::IValue& value, const std::string& source) {
  if (&module != split_module_ || !value.isGenericDict())
    return Fsdp::prepare_local_module_state(module, value, source);
  const auto dict = value.toGenericDict();
  c10::impl::GenericDict cut(dict.keyType(), dict.valueType());
  for (const auto& item : dict) {
    c10::IValue v = item.value();
    auto it = item.key().isString() ? module_splits_.find(item.key().toStringRef())
                                    : module_splits_.end();
    if (it != module_splits_.end() && v.isTensor() &&
        v.toTensor().sizes().vec() == it->second.whole_sizes) {
      v = it->second.shard.slice(v.toTensor(), it->second.along).contiguous();
    } else if (it != module_splits_.end()) {
      v = piece_of_slice(v, it->second);  // run_of_slice's piece
    }
    cut.insert(item.key(), v);
  }
  return Fsdp::prepare_local_module_state(module, cut, source);
}

std::optional<std::function<void()>> ModelParallel::prepare_split_optimizer_state(
    torch::optim::Optimizer& optimizer, const c10::IValue& state, const std::string& source) {
  if (shard_of(optimizer) == nullptr || !state.isGenericDict())
    return Fsdp::prepare_split_optimizer_state(optimizer, state, source);
  return Fsdp::prepare_split_optimizer_state(optimizer, map_split_buffers(state, false), source);
}

void ModelParallel::teardown() {
  // Whole again: fsdp's shards first (over dp_shard), then the tp slices (over tp), while the
  // groups still exist.
  keep_mesh_ = true;
  release_shards_whole();
  keep_mesh_ = false;
  if (split_module_ != nullptr && (!owned_ || !owner_.expired()))
    fabric::nn::unparallelize(*split_module_);
  split_module_ = nullptr;
  ParallelStrategy::teardown();  // release(): the mesh's groups end before the rendezvous
}

void ModelParallel::release() {
  Fsdp::release();
  // After an error the module keeps its slices: the groups that could gather them end here.
  if (!keep_mesh_) mesh_.reset();
}

}  // namespace fabric::strategies
