// Comparing checkpoint files in tests: bitwise (first_difference, compare_checkpoints) and
// within a tolerance (max_relative_difference).
#ifndef TESTS_CHECKPOINT_DIFF_H_
#define TESTS_CHECKPOINT_DIFF_H_

#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>

#include "fabric/checkpoint/archive.h"
#include "fabric/checkpoint/sharded.h"

namespace fabric::testing {

// "" when `a` and `b` are bitwise equal, else the path of the first difference.
inline std::string first_difference(const c10::IValue& a, const c10::IValue& b,
                                    const std::string& at) {
  if (a.tagKind() != b.tagKind()) return at + ": " + a.tagKind() + " vs " + b.tagKind();
  if (a.isTensor()) {
    const auto x = a.toTensor().contiguous(), y = b.toTensor().contiguous();
    if (x.scalar_type() != y.scalar_type() || !x.sizes().equals(y.sizes()))
      return at + ": dtype or shape";
    const size_t n = x.numel() * x.element_size();
    return n == 0 || std::memcmp(x.data_ptr(), y.data_ptr(), n) == 0 ? "" : at + ": values";
  }
  if (a.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return at + ": entry count";
    for (const auto& e : x) {
      auto it = y.find(e.key());
      if (it == y.end()) return at + ": no " + e.key().toStringRef();
      const std::string key =
          e.key().isString() ? e.key().toStringRef() : std::to_string(e.key().toInt());
      if (auto d = first_difference(e.value(), it->value(), at + "/" + key); !d.empty()) return d;
    }
    return "";
  }
  if (a.isList()) {
    const auto x = a.toList(), y = b.toList();
    if (x.size() != y.size()) return at + ": length";
    for (size_t i = 0; i < x.size(); ++i)
      if (auto d = first_difference(x.get(i), y.get(i), at + "/" + std::to_string(i)); !d.empty())
        return d;
    return "";
  }
  if (a.isTuple()) {
    const auto& x = a.toTupleRef().elements();
    const auto& y = b.toTupleRef().elements();
    if (x.size() != y.size()) return at + ": length";
    for (size_t i = 0; i < x.size(); ++i)
      if (auto d = first_difference(x[i], y[i], at + "/" + std::to_string(i)); !d.empty()) return d;
    return "";
  }
  if (a.isDouble()) return a.toDouble() == b.toDouble() ? "" : at + ": value";
  return a == b ? "" : at + ": value";
}

// The state and generator parts of a checkpoint (a file or a sharded folder) (its "fabric" header
// holds times and configs).
inline std::string compare_checkpoints(const std::filesystem::path& a,
                                       const std::filesystem::path& b) {
  const auto x = fabric::read_checkpoint(a).toGenericDict();
  const auto y = fabric::read_checkpoint(b).toGenericDict();
  for (const std::string key : {"state", "rng"}) {
    if (!x.contains(key) || !y.contains(key)) return "no " + key;
    if (auto d = first_difference(x.at(key), y.at(key), key); !d.empty()) return d;
  }
  return "";
}

// The largest |a − b| / max|a| over the floating tensors of `a` and `b` at the same places
// (values elsewhere must be equal; a difference in structure is +inf).
inline double max_relative_difference(const c10::IValue& a, const c10::IValue& b) {
  constexpr double kStructure = std::numeric_limits<double>::infinity();
  if (a.tagKind() != b.tagKind()) return kStructure;
  if (a.isTensor()) {
    const auto x = a.toTensor().cpu(), y = b.toTensor().cpu();
    if (x.scalar_type() != y.scalar_type() || !x.sizes().equals(y.sizes())) return kStructure;
    if (x.numel() == 0) return 0;
    if (!x.is_floating_point()) return torch::equal(x, y) ? 0 : kStructure;
    const double scale = std::max(x.abs().max().item<double>(), 1e-12);
    return (x - y).abs().max().item<double>() / scale;
  }
  double worst = 0;
  if (a.isGenericDict()) {
    const auto x = a.toGenericDict(), y = b.toGenericDict();
    if (x.size() != y.size()) return kStructure;
    for (const auto& e : x) {
      auto it = y.find(e.key());
      if (it == y.end()) return kStructure;
      worst = std::max(worst, max_relative_difference(e.value(), it->value()));
    }
    return worst;
  }
  if (a.isList()) {
    const auto x = a.toList(), y = b.toList();
    if (x.size() != y.size()) return kStructure;
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, max_relative_difference(x.get(i), y.get(i)));
    return worst;
  }
  return first_difference(a, b, "").empty() ? 0 : kStructure;
}

// "" when `a` and `b` agree: bitwise when `bound` is 0, else within `bound` (max relative);
// otherwise what differs, for a test's message.
inline std::string parity_failure(const c10::IValue& a, const c10::IValue& b, const std::string& at,
                                  double bound) {
  if (bound == 0) return first_difference(a, b, at);
  const double d = max_relative_difference(a, b);
  return d <= bound ? "" : at + ": max relative difference " + std::to_string(d);
}

}  // namespace fabric::testing

#endif  // TESTS_CHECKPOINT_DIFF_H_
