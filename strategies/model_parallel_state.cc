// ModelParallel's state side: this rank's parts of the split parameters (EMA), its pieces of
// them for sharded checkpoints, the optimizer state gathered whole for one file, and loading
// either back (strategies/model_parallel.h).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/checkpoint/piece_layout.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "strategies/model_parallel.h"

namespace fabric::strategies {

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
    part.offset += s.start;
    part.sizes = s.whole_sizes;
    part.layout = s.layout;
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
  // This rank's slice is its run of the tensor in s.layout's order; fsdp's piece of the slice a
  // run inside it.
  const auto strides = c10::contiguous_strides(s.whole_sizes);
  if (auto piece = as_tensor_piece(v))
    return tensor_piece(s.whole_sizes, strides, s.start + piece->offset,
                        first_copy ? piece->values : piece->values.new_empty({0}), s.layout);
  if (!v.isTensor() || !v.toTensor().sizes().equals(s.slice_sizes)) return v;
  // A slice fsdp does not shard (no gradient) is held by every dp rank: the first writes it.
  const torch::Tensor t = v.toTensor();
  return tensor_piece(s.whole_sizes, strides, s.start,
                      data_parallel_rank() == 0 ? t : t.new_empty({0}), s.layout);
}

std::optional<c10::IValue> ModelParallel::gather_optimizer_state(
    torch::optim::Optimizer& optimizer) {
  std::optional<c10::IValue> state = Fsdp::gather_optimizer_state(optimizer);
  if (!state || shard_of(optimizer) == nullptr) return state;
  torch::NoGradGuard no_grad;
  return map_split_buffers(*state, /*gather=*/true);
}

std::optional<PieceRange> ModelParallel::run_of_slice(
    const Split& s, at::IntArrayRef sizes, at::IntArrayRef strides,
    const std::optional<PieceLayout>& layout,
    const std::function<std::optional<PieceRange>(at::IntArrayRef)>& inner) const {
  if (!sizes.equals(s.whole_sizes) || !strides.equals(c10::contiguous_strides(sizes)))
    return std::nullopt;  // read whole, cut here
  const std::optional<PieceRange> in_slice = inner(s.slice_sizes);
  if (!in_slice) return std::nullopt;
  // Where the checkpoint lays the slices out as this job cuts them (the same tp size, or a cut
  // along the first dimension at any), this rank's slice is one run of it.
  if (layout == s.layout)
    return PieceRange{s.start + in_slice->offset, in_slice->count, {}, std::nullopt};
  // Written at another tp size: the same elements as runs of its order, so that this rank reads
  // and holds only its own part instead of the whole tensor.
  auto runs = slice_runs(s.whole_sizes, s.along, s.shard.style.parts, s.shard.size, s.shard.rank,
                         in_slice->offset, in_slice->count, layout);
  if (!runs) return std::nullopt;
  return PieceRange{s.start + in_slice->offset, in_slice->count, std::move(*runs), s.layout};
}

c10::IValue ModelParallel::piece_of_slice(const c10::IValue& v, const Split& s) const {
  auto piece = as_tensor_piece(v);
  if (!piece) return v;
  return tensor_piece(s.slice_sizes, c10::contiguous_strides(s.slice_sizes),
                      piece->offset - s.start, piece->values);
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
      // A view where the style has one part (fsdp then copies from it tensor by tensor: no copy
      // of every slice held at once, and of a memory-mapped file only this slice is read); a
      // fused layer's parts are joined (a copy).
      const Split& split = it->second;
      const torch::Tensor whole = v.toTensor();
      const int64_t n = whole.size(split.along) / split.shard.size;
      v = split.shard.style.parts == 1 ? whole.narrow(split.along, split.shard.rank * n, n)
                                       : split.shard.slice(whole, split.along);
    } else if (it != module_splits_.end() && v.isTensor()) {
      // Named in the model's whole shape (not this rank's slice's, which the check below sees).
      std::ostringstream why;
      why << source << ": does not match the model: shape of " << item.key().toStringRef() << " is "
          << v.toTensor().sizes() << " in the file, " << c10::IntArrayRef(it->second.whole_sizes)
          << " in the model";
      throw Error(why.str());
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

}  // namespace fabric::strategies
