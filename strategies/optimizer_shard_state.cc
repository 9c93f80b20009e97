// OptimizerShard's checkpoint side: the optimizer state in one process's layout, gathered
// (full_state) or as this rank's pieces (local_state), and loading it back (prepare_full_state).
#include <torch/optim.h>
#include <torch/types.h>

#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "fabric/checkpoint/optimizer_state.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"
#include "fabric/distributed/process_group.h"
#include "strategies/optimizer_shard.h"
#include "strategies/optimizer_shard_detail.h"

namespace fabric::strategies {
namespace {

using Dict = c10::impl::GenericDict;
using detail::alias;
using detail::describe;

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
  const torch::Device device = collective_device();
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
      torch::Tensor send = torch::zeros({shard_sizes_[s]}, torch::dtype(dtypes[f]).device(device));
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

std::optional<PieceRange> OptimizerShard::wanted(const std::string& path, at::IntArrayRef sizes,
                                                 at::IntArrayRef strides) const {
  // "state/I/FIELD"
  std::smatch m;
  static const std::regex kState("state/([0-9]+)/[^/]+");
  if (!std::regex_match(path, m, kState)) return std::nullopt;
  const size_t i = std::stoull(m[1]);
  if (i >= params_.size() || !params_[i].sizes().equals(sizes) ||
      !params_[i].strides().equals(strides))
    return std::nullopt;  // not this optimizer's layout: whole, and prepare_full_state says why
  for (const Piece& piece : pieces_)
    if (piece.param == i) return PieceRange{piece.begin, piece.length};
  return PieceRange{0, 0};  // this rank keeps none of it
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
  // One list per group: c10::List copies share their elements, so the vector's fill
  // constructor would give every group the same list.
  std::vector<c10::impl::GenericList> piece_ids;
  for (size_t g = 0; g < group_params_.size(); ++g) piece_ids.emplace_back(c10::AnyType::get());
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
      if (auto given = as_tensor_piece(e.value())) {  // what wanted() asked for
        if (!p.sizes().equals(given->sizes) || given->offset != piece.begin ||
            given->values.numel() != piece.length)
          return fail("'" + e.key().toStringRef() + "' of '" + names_[piece.param] +
                      "': the checkpoint gave elements " + std::to_string(given->offset) + " to " +
                      std::to_string(given->offset + given->values.numel()) + ", this rank keeps " +
                      std::to_string(piece.begin) + " to " +
                      std::to_string(piece.begin + piece.length));
        s.insert(e.key(), given->values);
      } else if (e.value().isTensor() && e.key().toStringRef() != "step") {
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
