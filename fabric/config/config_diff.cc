#include <yaml-cpp/yaml.h>

#include <map>

#include "fabric/config/config.h"

namespace fabric {
namespace {

void flatten(const YAML::Node& node, const std::string& prefix,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node)
      flatten(
          kv.second,
          prefix.empty() ? kv.first.as<std::string>() : prefix + "." + kv.first.as<std::string>(),
          out);
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  out[prefix] = e.c_str();
}

std::map<std::string, std::string> leaves(const std::string& yaml) {
  try {
    return config_leaves(yaml);
  } catch (const ConfigError&) {
    return {{"<config>", "(unreadable)"}};
  }
}

}  // namespace

std::map<std::string, std::string> config_leaves(const std::string& yaml) {
  std::map<std::string, std::string> out;
  try {
    flatten(YAML::Load(yaml), "", out);
  } catch (const YAML::Exception& e) {
    throw ConfigError("not a YAML config: " + e.msg);
  }
  return out;
}

std::vector<std::string> config_differences(const std::string& old_yaml,
                                            const std::string& new_yaml,
                                            const std::vector<std::string>& ignored_sections) {
  auto ignored = [&](const std::string& key) {
    for (const auto& s : ignored_sections)
      if (key == s || key.rfind(s + ".", 0) == 0) return true;
    return false;
  };
  const auto before = leaves(old_yaml), after = leaves(new_yaml);
  std::vector<std::string> out;
  auto a = before.begin();
  auto b = after.begin();
  while (a != before.end() || b != after.end()) {
    if (b == after.end() || (a != before.end() && a->first < b->first)) {
      if (!ignored(a->first)) out.push_back(a->first + " " + a->second + " → (absent)");
      ++a;
    } else if (a == before.end() || b->first < a->first) {
      if (!ignored(b->first)) out.push_back(b->first + " (absent) → " + b->second);
      ++b;
    } else {
      if (a->second != b->second && !ignored(a->first))
        out.push_back(a->first + " " + a->second + " → " + b->second);
      ++a;
      ++b;
    }
  }
  return out;
}

}  // namespace fabric
