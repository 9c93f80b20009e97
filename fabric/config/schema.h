// fabric::ConfigSchema: every config key a program accepts, with its type, default, allowed values
// and documentation. Config loading validates files and overrides against it, so an unknown key, a
// wrong type, a bad enum value or an out-of-range number is an error naming file, line and column.
//
// Programs extend the standard schema (fabric/config/standard_keys.h) with their own sections:
//
//   fabric::ConfigSchema schema = fabric::training_schema();
//   schema.add("model.width", fabric::KeySpec::integer(64).min(1).doc("channels of the first
//   layer"));
//
// Thread-safety: build once, then read-only.
#ifndef FABRIC_CONFIG_SCHEMA_H_
#define FABRIC_CONFIG_SCHEMA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fabric {

enum class KeyType {
  kBool,
  kInt,
  kFloat,
  kString,
  kChoice,      // one of a fixed set of strings (with optional aliases)
  kFloatList,   // [0.9, 0.999]
  kChoiceList,  // [csv, tensorboard]: each element one of a fixed set, no repeats
  kStringList,  // ["*.bias", "type:*Norm*"]: free non-empty strings, no repeats
  kDevices,     // auto | N (≥ 1) | -1 (all) | [id, ...]
};

// One key: type, default, constraints, documentation. Built with the static constructors and
// chainable setters; the default is always valid for the constraints (checked by
// ConfigSchema::add).
class KeySpec {
 public:
  static KeySpec boolean(bool default_value);
  static KeySpec integer(int64_t default_value);
  static KeySpec real(double default_value);
  static KeySpec string(std::string default_value);
  static KeySpec choice(std::vector<std::string> choices, std::string default_value);
  static KeySpec real_list(std::vector<double> default_value);
  static KeySpec choice_list(std::vector<std::string> choices,
                             std::vector<std::string> default_value);
  static KeySpec string_list(std::vector<std::string> default_value);
  static KeySpec devices();  // Default: auto.

  // Numeric bounds (kInt, kFloat, and each element of kFloatList).
  KeySpec& min(double bound, bool inclusive = true);
  KeySpec& max(double bound, bool inclusive = true);
  // A value inside the bounds that is refused all the same (e.g. 0 where -1 means "all").
  KeySpec& except(double value);
  // kChoice: `alias` is accepted and stored as `canonical` (e.g. "16" → "16-mixed").
  KeySpec& alias(std::string alias, std::string canonical);
  // kChoice: what a value is, for messages ("'x' is not a precision"). Default: "an allowed value".
  KeySpec& noun(std::string noun);
  // kInt: the word `auto` is also accepted (the program decides; Config::is_auto).
  KeySpec& or_auto();
  KeySpec& doc(std::string text);

  KeyType type() const { return type_; }
  const std::string& default_text() const { return default_text_; }  // YAML text of the default.
  const std::vector<std::string>& choices() const { return choices_; }
  const std::map<std::string, std::string>& aliases() const { return aliases_; }
  const std::string& noun_text() const { return noun_; }
  const std::string& doc_text() const { return doc_; }
  bool allows_auto() const { return or_auto_; }
  const std::optional<double>& min_bound() const { return min_; }
  const std::optional<double>& max_bound() const { return max_; }
  const std::optional<double>& excluded() const { return excluded_; }
  bool min_inclusive() const { return min_inclusive_; }
  bool max_inclusive() const { return max_inclusive_; }
  std::string type_name() const;  // "integer", "one of a|b|c", ...

 private:
  friend class ConfigSchema;
  explicit KeySpec(KeyType type, std::string default_text)
      : type_(type), default_text_(std::move(default_text)) {}
  KeyType type_;
  std::string default_text_;
  std::vector<std::string> choices_;
  std::map<std::string, std::string> aliases_;
  std::string noun_ = "an allowed value";
  std::string doc_;
  std::optional<double> min_, max_, excluded_;
  bool min_inclusive_ = true, max_inclusive_ = true;
  bool or_auto_ = false;
};

class ConfigSchema {
 public:
  // Declares `path` ("section.key" or deeper, e.g. "fabric.ddp.timeout_s"). Throws fabric::Error
  // if the path is declared twice, is a prefix of another key, or its default is invalid.
  ConfigSchema& add(const std::string& path, KeySpec spec);
  // Replaces the default of a declared key with `yaml_text` (validated), e.g. an example's
  // data.root.
  ConfigSchema& set_default(const std::string& path, const std::string& yaml_text);
  // Documents a section ("fabric") for --help.
  ConfigSchema& section_doc(const std::string& section, std::string text);

  const KeySpec* find(const std::string& path) const;
  // True when `path` is a proper prefix of a declared key ("fabric", "fabric.ddp").
  bool is_section(const std::string& path) const;
  const std::vector<std::string>& paths() const { return paths_; }  // declaration order
  std::vector<std::string> sections() const;                        // top-level, in order
  std::string section_documentation(const std::string& section) const;

 private:
  std::vector<std::string> paths_;
  std::map<std::string, KeySpec> specs_;
  std::map<std::string, std::string> section_docs_;
};

}  // namespace fabric

#endif  // FABRIC_CONFIG_SCHEMA_H_
