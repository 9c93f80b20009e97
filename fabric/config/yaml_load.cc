#include "fabric/config/yaml_load.h"

#include <map>

#include "fabric/core/error.h"

namespace fabric {
namespace {

void check_unique(const YAML::Node& node, const std::string& path, const std::string& file) {
  if (node.IsMap()) {
    std::map<std::string, int> first_line;
    for (const auto& kv : node) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      const std::string at = path.empty() ? key : path + "." + key;
      const auto [it, fresh] = first_line.emplace(key, kv.first.Mark().line + 1);
      if (!fresh && kv.first.IsScalar())
        throw ConfigError(yaml_location(file, kv.first.Mark()) + ": " + at +
                          ": duplicate key (first at line " + std::to_string(it->second) +
                          "); give each key once");
      check_unique(kv.second, at, file);
    }
  } else if (node.IsSequence()) {
    std::size_t i = 0;
    for (const auto& item : node) check_unique(item, path + "[" + std::to_string(i++) + "]", file);
  }
}

}  // namespace

std::string yaml_location(const std::string& file, const YAML::Mark& mark) {
  if (mark.is_null()) return file;
  return file + ":" + std::to_string(mark.line + 1) + ":" + std::to_string(mark.column + 1);
}

YAML::Node load_yaml(const std::string& text, const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::ParserException& e) {
    throw ConfigError(yaml_location(file, e.mark) + ": YAML syntax error: " + e.msg);
  }
  check_unique(root, "", file);
  return root;
}

}  // namespace fabric
