// ShardedParameters::plan_units: which parameters the wrapping policy groups into units.
#include <functional>
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
  using Named = std::vector<std::pair<std::string, torch::Tensor>>;
  auto make_unit = [&units](const std::string& name, bool root, const Named& members) {
    PlannedUnit u;
    u.name = name;
    u.root = root;
    for (const auto& [n, t] : members) {
      u.names.push_back(n);
      u.params.push_back(t);
    }
    units.push_back(std::move(u));
  };
  std::set<std::string> types_seen;  // the module types, as fabric.fsdp.wrap_modules names them
  std::set<std::string> names_matched;
  std::function<Named(const torch::nn::Module&, const std::string&, bool)> visit =
      [&](const torch::nn::Module& m, const std::string& path, bool root) -> Named {
    types_seen.insert(module_type_stem(m.name()));
    for (const auto& n : policy.wrap_modules)
      if (type_matches(m.name(), {n})) names_matched.insert(n);
    Named mine;
    for (const auto& item : m.named_parameters(/*recurse=*/false)) {
      const torch::Tensor& t = item.value();
      if (!t.requires_grad() || !seen.insert(t.unsafeGetTensorImpl()).second) continue;
      if (!storages.insert(t.storage().unsafeGetStorageImpl()).second)
        throw Error(std::string(kKey) + ": parameter '" + path + item.key() +
                    "' shares memory with another parameter (tied weights are not supported)");
      mine.emplace_back(path + item.key(), t);
    }
    for (const auto& child : m.named_children()) {
      Named sub = visit(*child.value(), path + child.key() + ".", false);
      mine.insert(mine.end(), sub.begin(), sub.end());
    }
    if (root) return mine;
    int64_t elements = 0;
    for (const auto& [n, t] : mine) elements += t.numel();
    const bool by_type = type_matches(m.name(), policy.wrap_modules);
    const bool by_size = policy.min_unit_params > 0 && elements >= policy.min_unit_params;
    if (!mine.empty() && (by_type || by_size)) {
      make_unit(path.substr(0, path.size() - 1), false, mine);
      return {};
    }
    return mine;
  };
  Named rest = visit(module, "", true);
  // A name that matches no module would leave its modules unsharded in silence (a typo).
  const std::vector<std::string> types(types_seen.begin(), types_seen.end());
  for (const auto& n : policy.wrap_modules)
    if (!names_matched.count(n))
      throw Error("fabric.fsdp.wrap_modules: '" + n + "' is no module type of this model" +
                  did_you_mean(n, types) + " (its types: " + join(types) + ")");
  if (!rest.empty()) make_unit("(root)", true, rest);
  if (units.empty())
    throw Error(std::string(kKey) + ": the module has no parameters that require gradients");
  return units;
}

}  // namespace fabric::strategies
