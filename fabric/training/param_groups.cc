#include "fabric/training/param_groups.h"

#include <fnmatch.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <unordered_set>

#include "fabric/core/error.h"
#include "fabric/nn/module_type.h"

namespace fabric {
namespace {

struct Named {
  std::string name;
  torch::Tensor tensor;
  std::string type;  // Module::name() of the module that holds it
};

// named_parameters() order (a module's own parameters, then its children's, depth first), each
// tensor once. Walks children, so the module need not be owned by a shared_ptr.
void collect(const torch::nn::Module& m, const std::string& prefix, std::vector<Named>& out,
             std::unordered_set<const void*>& seen) {
  for (const auto& p : m.named_parameters(/*recurse=*/false)) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second)
      out.push_back({prefix + p.key(), p.value(), m.name()});
  }
  for (const auto& child : m.named_children())
    collect(*child.value(), prefix + child.key() + ".", out, seen);
}

bool glob(const std::string& pattern, const std::string& text) {
  return fnmatch(pattern.c_str(), text.c_str(), 0) == 0;
}

}  // namespace

bool selector_matches(const std::string& selector, const std::string& name,
                      const std::string& module_type) {
  static const std::string kType = "type:";
  if (selector.compare(0, kType.size(), kType) == 0)
    return glob(selector.substr(kType.size()), module_type_stem(module_type));
  return glob(selector, name);
}

std::pair<std::string, double> parse_lr_scale(const std::string& text) {
  const size_t eq = text.rfind('=');
  const std::string how = "write SELECTOR=FACTOR, e.g. \"fc.*=10\"";
  if (eq == std::string::npos || eq == 0) throw Error("'" + text + "': " + how);
  const std::string number = text.substr(eq + 1);
  char* end = nullptr;
  const double factor = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(factor) ||
      factor <= 0)
    throw Error("'" + text + "': the factor '" + number + "' is not a number > 0; " + how);
  return {text.substr(0, eq), factor};
}

std::vector<ParamGroup> group_parameters(const torch::nn::Module& module,
                                         const ParamGroupRules& rules, bool require_matches) {
  std::vector<Named> all;
  std::unordered_set<const void*> seen;
  collect(module, "", all, seen);
  std::map<std::string, bool> used;
  auto matches = [&](const std::string& selector, const Named& p) {
    const bool hit = selector_matches(selector, p.name, p.type);
    if (hit) used[selector] = true;
    return hit;
  };
  // Group 0: scale 1 with decay (kept first, possibly empty); others by first appearance.
  std::vector<ParamGroup> groups(1);
  for (const Named& p : all) {
    ParamGroup key;
    bool scaled = false;
    for (const auto& [selector, factor] : rules.lr_scale) {
      if (matches(selector, p) && !scaled) {  // the first match decides; all are marked used
        key.lr_scale = factor;
        scaled = true;
      }
    }
    for (const auto& selector : rules.no_weight_decay)
      if (matches(selector, p)) key.weight_decay = false;  // every selector marked as used
    size_t g = 0;
    while (g < groups.size() &&
           (groups[g].lr_scale != key.lr_scale || groups[g].weight_decay != key.weight_decay))
      ++g;
    if (g == groups.size()) groups.push_back(key);
    groups[g].params.push_back(p.tensor);
    groups[g].names.push_back(p.name);
  }
  std::vector<std::string> selectors = rules.no_weight_decay;
  for (const auto& rule : rules.lr_scale) selectors.push_back(rule.first);
  for (const auto& selector : selectors) {
    if (used.count(selector) || !require_matches) continue;
    std::string examples;
    for (size_t i = 0; i < all.size() && i < 3; ++i)
      examples += (i ? ", " : "") + ("'" + all[i].name + "'");
    throw Error("'" + selector + "' matches no parameter of " + module_type_stem(module.name()) +
                " (parameter names look like " + (examples.empty() ? "(none)" : examples) +
                "; module types are written like type:" +
                (all.empty() ? std::string("Linear") : module_type_stem(all[0].type)) + ")");
  }
  if (groups[0].params.empty()) groups.erase(groups.begin());
  return groups;
}

}  // namespace fabric
