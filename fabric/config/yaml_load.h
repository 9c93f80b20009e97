// Reading YAML text the way every file of this project is read: yaml-cpp keeps a key given twice
// in one mapping (and lookups then see one of them), so the whole tree is checked for that.
#ifndef FABRIC_CONFIG_YAML_LOAD_H_
#define FABRIC_CONFIG_YAML_LOAD_H_

#include <yaml-cpp/yaml.h>

#include <string>

namespace fabric {

// Parses `text`, read from `file` (its name in messages). A syntax error, or a key given twice in
// any mapping of the tree, is a ConfigError "FILE:LINE:COL: ...": for a duplicate, the second
// key's place and its dotted path, e.g. "s.yaml:5:3: grid.lr: duplicate key (first at line 4);
// give each key once". Used by the sweep file parser; Config's own loader checks its keys as it
// flattens them.
YAML::Node load_yaml(const std::string& text, const std::string& file);

// "FILE:LINE:COL" of `mark` (1-based), or FILE when the mark is null: how every YAML error of this
// project names its place.
std::string yaml_location(const std::string& file, const YAML::Mark& mark);

}  // namespace fabric

#endif  // FABRIC_CONFIG_YAML_LOAD_H_
