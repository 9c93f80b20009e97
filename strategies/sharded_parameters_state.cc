// ShardedParameters' checkpoint side: this rank's pieces of the parameters for sharded
// checkpoints (local_state) and loading them back straight into the shards (wanted,
// prepare_load), nothing gathered.
#include <torch/types.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "fabric/checkpoint/sharded.h"
#include "fabric/checkpoint/state_dict.h"
#include "fabric/core/error.h"
#include "strategies/sharded_parameters.h"

namespace fabric::strategies {

std::pair<int64_t, int64_t> ShardedParameters::own_range(const Unit& u, size_t i) const {
  // The parameter's elements [a, b) of the unit's flat vector, this rank's [lo, hi).
  const int64_t a = u.offsets[i], b = a + u.params[i].numel();
  const int64_t lo = rank_ * u.shard_size, hi = lo + u.shard_size;
  const int64_t x = std::max(a, lo), y = std::min(b, hi);
  return x < y ? std::make_pair(x - a, y - a) : std::make_pair(int64_t{0}, int64_t{0});
}

torch::Tensor ShardedParameters::own_values(const Unit& u, size_t i) const {
  const auto [x, y] = own_range(u, i);
  return x < y ? u.shard.narrow(0, x + u.offsets[i] - rank_ * u.shard_size, y - x)
               : torch::empty({0}, u.shard.options());
}

std::optional<PieceRange> ShardedParameters::wanted(const std::string& path, at::IntArrayRef sizes,
                                                    at::IntArrayRef strides) const {
  auto it = by_path_.find(path);
  if (it == by_path_.end()) return std::nullopt;
  const Unit& u = units_[it->second.first];
  const torch::Tensor& p = u.params[it->second.second];
  if (!p.sizes().equals(sizes) || !strides.equals(c10::contiguous_strides(sizes)))
    return std::nullopt;
  const auto [x, y] = own_range(u, it->second.second);
  return PieceRange{x, y - x};
}

std::function<void()> ShardedParameters::prepare_load(const torch::nn::Module& module,
                                                      const c10::IValue& value,
                                                      const std::string& source) {
  std::map<std::string, PartialTarget> partial;
  for (const auto& [path, where] : by_path_) {
    const Unit& u = units_[where.first];
    const size_t i = where.second;
    const auto [x, y] = own_range(u, i);
    const torch::Tensor destination = own_values(u, i);
    partial[u.names[i]] = [destination, x = x, y = y](const c10::IValue& v) {
      if (auto piece = as_tensor_piece(v)) {
        if (piece->offset != x || piece->values.numel() != y - x)
          throw Error("the checkpoint gave elements " + std::to_string(piece->offset) + " to " +
                      std::to_string(piece->offset + piece->values.numel()) + ", this rank keeps " +
                      std::to_string(x) + " to " + std::to_string(y));
        return std::function<void()>(
            [destination, from = piece->values] { destination.copy_(from); });
      }
      // The whole tensor, maybe a strided view (model_parallel's slice of a memory-mapped file):
      // its elements [x, y) taken only when copied, so that loading holds no copy of any but the
      // one being copied (a run of a strided view is a copy).
      return std::function<void()>([destination, whole = v.toTensor(), x = x, y = y] {
        if (x == y) return;
        if (x == 0 && y == whole.numel()) {
          destination.view(whole.sizes()).copy_(whole);
        } else {
          destination.copy_(whole.reshape(-1).narrow(0, x, y - x));
        }
      });
    };
  }
  auto copy = prepare_load_state_dict(module, value, source, partial);
  return [this, copy = std::move(copy)] {
    copy();
    for (auto& u : units_) release(u);  // what was gathered holds the old values
  };
}

std::vector<ParameterPart> ShardedParameters::parts(const torch::nn::Module& module) const {
  std::unordered_map<const void*, std::pair<size_t, size_t>> where;  // unit, index
  for (size_t k = 0; k < units_.size(); ++k)
    for (size_t i = 0; i < units_[k].params.size(); ++i)
      where[units_[k].params[i].unsafeGetTensorImpl()] = {k, i};
  std::vector<ParameterPart> out;
  for (const auto& item : module.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.defined() || !p.is_floating_point()) continue;
    auto it = where.find(p.unsafeGetTensorImpl());
    if (it == where.end()) {  // not sharded (does not require gradients)
      out.push_back({item.key(), p.detach(), p.sizes().vec(), 0, false});
      continue;
    }
    const Unit& u = units_[it->second.first];
    const size_t i = it->second.second;
    out.push_back({item.key(), own_values(u, i), p.sizes().vec(), own_range(u, i).first, true});
  }
  return out;
}

c10::IValue ShardedParameters::local_state(const torch::nn::Module& module) const {
  std::unordered_map<const void*, std::pair<size_t, size_t>> where;  // unit, index
  for (size_t k = 0; k < units_.size(); ++k)
    for (size_t i = 0; i < units_[k].params.size(); ++i)
      where[units_[k].params[i].unsafeGetTensorImpl()] = {k, i};
  c10::impl::GenericDict out(c10::StringType::get(), c10::AnyType::get());
  for (const auto& item : module.named_parameters()) {
    const torch::Tensor& p = item.value();
    if (!p.defined()) continue;
    auto it = where.find(p.unsafeGetTensorImpl());
    if (it == where.end()) {  // not sharded (does not require gradients)
      out.insert(item.key(), p.detach());
      continue;
    }
    const Unit& u = units_[it->second.first];
    const size_t i = it->second.second;
    const auto [x, y] = own_range(u, i);
    out.insert(item.key(),
               tensor_piece(p.sizes(), c10::contiguous_strides(p.sizes()), x, own_values(u, i)));
  }
  for (const auto& item : module.named_buffers())
    if (item.value().defined()) out.insert(item.key(), item.value().detach());
  return out;
}

}  // namespace fabric::strategies
