// ShardedParameters::plan_units: which parameters the wrapping policy groups into units.
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/core/suggest.h"
#include "fabric/nn/module_type.h"
#include "strategies/sharded_parameters.h"

namespace fabric::strategies {
namespace {

constexpr const char* kKey = "fabric.strategy: fsdp";

// torch::nn::LinearImpl, "Linear", "LinearImpl" and "torch::nn::LinearImpl" all match.
bool type_matches(const std::string& type, const std::vector<std::string>& names) {
  const size_t colon = type.rfind("::");
  const std::string bare = type.substr(colon == std::string::npos ? 0 : colon + 2);
  const std::string stem = module_type_stem(type);
  for (const auto& n : names)
    if (n == type || n == bare || n == stem) return true;
  return false;
}

}  // namespace

std::vector<ShardedParameters::PlannedUnit> ShardedParameters::plan_units(
    const torch::nn::Module& module, const ShardingPolicy& policy) {
  std::vector<PlannedUnit> units;
  // The units, inner ones first (as PyTorch's auto-wrap policies recurse), the root last.
  std::set<const void*> seen;
  std::set<const void*> storages;
  // Storages held by more than one parameter object: tied. A frozen one stays whole.
  std::map<const void*, int> holders;
  {
    std::set<const void*> objects;
    for (const auto& t : module.parameters())
      if (t.defined() && t.has_storage() && objects.insert(t.unsafeGetTensorImpl()).second)
        ++holders[t.storage().unsafeGetStorageImpl()];
  }
  using Named = std::vector<std::pair<std::string, torch::Tensor>>;
  struct Members {
    Named trainable, frozen;
  };
  auto make_units = [&units](const std::string& name, bool root, const Members& members) {
    const size_t group = units.empty() ? 0 : units.back().group + 1;
    auto add = [&](const std::string& unit_name, bool frozen, const Named& named) {
      PlannedUnit u;
      u.name = unit_name;
      u.root = root;
      u.frozen = frozen;
      u.group = group;
      for (const auto& [n, t] : named) {
        u.names.push_back(n);
        u.params.push_back(t);
      }
      units.push_back(std::move(u));
    };
    if (!members.trainable.empty()) add(name, false, members.trainable);
    // One frozen unit per dtype, in the order the dtypes first appear.
    std::vector<c10::ScalarType> dtypes;
    for (const auto& [n, t] : members.frozen)
      if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end())
        dtypes.push_back(t.scalar_type());
    for (c10::ScalarType dtype : dtypes) {
      Named of_dtype;
      for (const auto& [n, t] : members.frozen)
        if (t.scalar_type() == dtype) of_dtype.emplace_back(n, t);
      add(name + " (frozen" +
              (dtypes.size() > 1 ? std::string(" ") + c10::toString(dtype) : std::string()) + ")",
          true, of_dtype);
    }
  };
  std::set<std::string> types_seen;  // the module types, as fabric.fsdp.wrap_modules names them
  std::set<std::string> names_matched;
  std::function<Members(const torch::nn::Module&, const std::string&, bool)> visit =
      [&](const torch::nn::Module& m, const std::string& path, bool root) -> Members {
    types_seen.insert(module_type_stem(m.name()));
    for (const auto& n : policy.wrap_modules)
      if (type_matches(m.name(), {n})) names_matched.insert(n);
    Members mine;
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
      const torch::Tensor& t = item.value();
      if (!t.defined() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
      if (!t.requires_grad()) {
        if (t.has_storage() && holders[t.storage().unsafeGetStorageImpl()] == 1)
          mine.frozen.emplace_back(path + item.key(), t);
        continue;
      }
      if (!storages.insert(t.storage().unsafeGetStorageImpl()).second)
        throw Error(std::string(kKey) + ": parameter '" + path + item.key() +
                    "' shares memory with another parameter (tied weights are not supported)");
      mine.trainable.emplace_back(path + item.key(), t);
    }
    for (const auto& child : m.named_children()) {
      Members sub = visit(*child.value(), path + child.key() + ".", false);
      mine.trainable.insert(mine.trainable.end(), sub.trainable.begin(), sub.trainable.end());
      mine.frozen.insert(mine.frozen.end(), sub.frozen.begin(), sub.frozen.end());
    }
    if (root) return mine;
    int64_t elements = 0;
    for (const auto& [n, t] : mine.trainable) elements += t.numel();
    for (const auto& [n, t] : mine.frozen) elements += t.numel();
    const bool by_type = type_matches(m.name(), policy.wrap_modules);
    const bool by_size = policy.min_unit_params > 0 && elements >= policy.min_unit_params;
    if ((!mine.trainable.empty() || !mine.frozen.empty()) && (by_type || by_size)) {
      make_units(path.substr(0, path.size() - 1), false, mine);
      return {};
    }
    return mine;
  };
  Members rest = visit(module, "", true);
  // A name that matches no module would leave its modules unsharded in silence (a typo).
  const std::vector<std::string> types(types_seen.begin(), types_seen.end());
  for (const auto& n : policy.wrap_modules)
    if (!names_matched.count(n))
      throw Error("fabric.fsdp.wrap_modules: '" + n + "' is no module type of this model" +
                  did_you_mean(n, types) + " (its types: " + join(types) + ")");
  if (!rest.trainable.empty() || !rest.frozen.empty()) make_units("(root)", true, rest);
  if (std::none_of(units.begin(), units.end(), [](const PlannedUnit& u) { return !u.frozen; }))
    throw Error(std::string(kKey) + ": the module has no parameters that require gradients");
  return units;
}

}  // namespace fabric::strategies
