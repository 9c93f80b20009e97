#include "fabric/config/schema.h"

#include "fabric/config/internal/value.h"
#include "fabric/core/error.h"
#include "fabric/core/suggest.h"

namespace fabric {

KeySpec KeySpec::boolean(bool default_value) {
  return KeySpec(KeyType::kBool, default_value ? "true" : "false");
}

KeySpec KeySpec::integer(int64_t default_value) {
  return KeySpec(KeyType::kInt, std::to_string(default_value));
}

KeySpec KeySpec::real(double default_value) {
  return KeySpec(KeyType::kFloat, internal::format_double(default_value));
}

KeySpec KeySpec::string(std::string default_value) {
  YAML::Emitter out;
  out << default_value;
  return KeySpec(KeyType::kString, out.c_str());
}

KeySpec KeySpec::choice(std::vector<std::string> choices, std::string default_value) {
  KeySpec spec(KeyType::kChoice, std::move(default_value));
  spec.choices_ = std::move(choices);
  return spec;
}

KeySpec KeySpec::real_list(std::vector<double> default_value) {
  std::vector<std::string> items;
  for (double v : default_value) items.push_back(internal::format_double(v));
  return KeySpec(KeyType::kFloatList, "[" + join(items) + "]");
}

KeySpec KeySpec::choice_list(std::vector<std::string> choices,
                             std::vector<std::string> default_value) {
  KeySpec spec(KeyType::kChoiceList, "[" + join(default_value) + "]");
  spec.choices_ = std::move(choices);
  return spec;
}

KeySpec KeySpec::string_list(std::vector<std::string> default_value) {
  YAML::Emitter out;
  out << YAML::Flow << default_value;
  return KeySpec(KeyType::kStringList, out.c_str());
}

KeySpec KeySpec::devices() { return KeySpec(KeyType::kDevices, "auto"); }

KeySpec& KeySpec::min(double bound, bool inclusive) {
  min_ = bound;
  min_inclusive_ = inclusive;
  return *this;
}

KeySpec& KeySpec::max(double bound, bool inclusive) {
  max_ = bound;
  max_inclusive_ = inclusive;
  return *this;
}

KeySpec& KeySpec::except(double value) {
  excluded_ = value;
  return *this;
}

KeySpec& KeySpec::alias(std::string alias, std::string canonical) {
  aliases_[std::move(alias)] = std::move(canonical);
  return *this;
}

KeySpec& KeySpec::noun(std::string noun) {
  noun_ = std::move(noun);
  return *this;
}

KeySpec& KeySpec::or_auto() {
  or_auto_ = true;
  return *this;
}

KeySpec& KeySpec::doc(std::string text) {
  doc_ = std::move(text);
  return *this;
}

std::string KeySpec::type_name() const {
  switch (type_) {
    case KeyType::kBool:
      return "a boolean";
    case KeyType::kInt:
      return or_auto_ ? "an integer or auto" : "an integer";
    case KeyType::kFloat:
      return "a number";
    case KeyType::kString:
      return "a string";
    case KeyType::kChoice:
      return "one of " + join(choices_, "|");
    case KeyType::kFloatList:
      return "a list of numbers";
    case KeyType::kChoiceList:
      return "a list of " + join(choices_, "|");
    case KeyType::kStringList:
      return "a list of strings";
    case KeyType::kDevices:
      return "auto, a device count or a list of device ids";
  }
  return "a value";
}

ConfigSchema& ConfigSchema::add(const std::string& path, KeySpec spec) {
  if (path.empty() || path.front() == '.' || path.back() == '.' ||
      path.find('.') == std::string::npos) {
    throw Error("ConfigSchema::add: '" + path + "' is not a dotted key like 'section.key'");
  }
  if (specs_.count(path)) throw Error("ConfigSchema::add: '" + path + "' is declared twice");
  for (const auto& other : paths_) {
    if (other.rfind(path + ".", 0) == 0 || path.rfind(other + ".", 0) == 0)
      throw Error("ConfigSchema::add: '" + path + "' and '" + other +
                  "' cannot both be keys (one is a section of the other)");
  }
  auto checked = internal::normalize_value(spec, YAML::Load(spec.default_text()));
  if (!checked.error.empty())
    throw Error("ConfigSchema::add: default of '" + path + "': " + checked.error);
  paths_.push_back(path);
  specs_.emplace(path, std::move(spec));
  return *this;
}

ConfigSchema& ConfigSchema::set_default(const std::string& path, const std::string& yaml_text) {
  auto it = specs_.find(path);
  if (it == specs_.end()) throw Error("ConfigSchema::set_default: unknown key '" + path + "'");
  KeySpec updated = it->second;
  updated.default_text_ = yaml_text;
  auto checked = internal::normalize_value(updated, YAML::Load(yaml_text));
  if (!checked.error.empty())
    throw Error("ConfigSchema::set_default: default of '" + path + "': " + checked.error);
  it->second = std::move(updated);
  return *this;
}

ConfigSchema& ConfigSchema::section_doc(const std::string& section, std::string text) {
  section_docs_[section] = std::move(text);
  return *this;
}

const KeySpec* ConfigSchema::find(const std::string& path) const {
  auto it = specs_.find(path);
  return it == specs_.end() ? nullptr : &it->second;
}

bool ConfigSchema::is_section(const std::string& path) const {
  for (const auto& p : paths_)
    if (p.rfind(path + ".", 0) == 0) return true;
  return false;
}

std::vector<std::string> ConfigSchema::sections() const {
  std::vector<std::string> out;
  for (const auto& p : paths_) {
    std::string section = p.substr(0, p.find('.'));
    bool seen = false;
    for (const auto& s : out) seen |= s == section;
    if (!seen) out.push_back(section);
  }
  return out;
}

std::string ConfigSchema::section_documentation(const std::string& section) const {
  auto it = section_docs_.find(section);
  return it == section_docs_.end() ? "" : it->second;
}

}  // namespace fabric
