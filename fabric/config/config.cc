#include "fabric/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "fabric/config/internal/value.h"
#include "fabric/config/yaml_load.h"
#include "fabric/core/files.h"
#include "fabric/core/hash.h"
#include "fabric/core/paths.h"
#include "fabric/core/suggest.h"
#include "fabric/core/utf8.h"

namespace fs = std::filesystem;

namespace fabric {
namespace {

struct Entry {
  YAML::Node value;
  std::string origin;  // "file:line:col" of the value, "command line", or "default"
};

using Entries = std::map<std::string, Entry>;

std::string location(const std::string& file, const YAML::Mark& mark) {
  return yaml_location(file, mark);
}

[[noreturn]] void fail(const std::string& where, const std::string& message) {
  throw ConfigError(where + ": " + message);
}

std::vector<std::string> config_search_dirs() {
  const char* dir = std::getenv("FABRIC_CONFIG_DIR");
  return dir ? std::vector<std::string>{dir} : std::vector<std::string>{};
}

// The first existing candidate, or ConfigError listing every place tried (with a did-you-mean
// among the YAML files of the folders that exist).
fs::path find_config(const std::string& name, const std::vector<fs::path>& first_try,
                     const std::string& where) {
  std::vector<fs::path> tried = first_try;
  for (const auto& c : search_candidates(name, "configs", config_search_dirs())) tried.push_back(c);
  std::error_code ec;
  std::vector<std::string> seen, nearby;
  for (const auto& c : tried) {
    if (fs::is_regular_file(c, ec)) return c;
    if (c == tried.front() && fs::exists(c, ec) && !fs::is_directory(c, ec))
      fail(where, "config file '" + name + "' is " + file_kind(c) + ", not a regular file; " +
                      "give a YAML file");
    if (c == tried.front() && fs::is_directory(c, ec)) {
      // A folder where a file was meant: its YAML files are the likely choice.
      std::vector<std::string> inside;
      for (const auto& entry : fs::directory_iterator(c, ec)) {
        const std::string ext = entry.path().extension().string();
        if (ext == ".yaml" || ext == ".yml") inside.push_back(entry.path().filename().string());
      }
      std::sort(inside.begin(), inside.end());
      if (inside.size() > 4) inside.resize(4);
      fail(where, "config file '" + name + "' is a folder; give a YAML file" +
                      (inside.empty() ? std::string() : " (it holds " + join(inside) + ")"));
    }
    seen.push_back(c.string());
    for (const auto& entry : fs::directory_iterator(c.parent_path(), ec)) {
      const std::string ext = entry.path().extension().string();
      if (ext == ".yaml" || ext == ".yml") nearby.push_back(entry.path().filename().string());
    }
  }
  std::string hint = did_you_mean(fs::path(name).filename().string(), nearby);
  fail(where, "config file '" + name + "' not found" + hint + " (tried " + join(seen) + ")");
}

// How a config file is named in messages: relative to the working directory when inside it,
// "configs/NAME" when found in the workspace's or runfiles' configs/, else the absolute path.
std::string display_config(const fs::path& path) {
  const std::string shown = display_path(path);
  if (!fs::path(shown).is_absolute()) return shown;
  for (const auto& root : {workspace_directory(), runfiles_directory()}) {
    if (!root) continue;
    const fs::path rel =
        path.lexically_normal().lexically_relative((*root / "configs").lexically_normal());
    if (!rel.empty() && *rel.begin() != "..") return (fs::path("configs") / rel).string();
  }
  return shown;
}

YAML::Node read_yaml(const fs::path& path, const std::string& display) {
  std::ifstream in(path);
  if (!in) fail(display, std::string("cannot read: ") + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  try {
    return YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    fail(location(display, e.mark), "YAML syntax error: " + e.msg);
  }
}

class Loader {
 public:
  explicit Loader(const ConfigSchema& schema) : schema_(schema) {}

  // Flattens `node` (a mapping at `prefix`) into `out`, checking keys against the schema.
  void flatten(const YAML::Node& node, const std::string& prefix, const std::string& file,
               Entries& out) {
    std::set<std::string> local;
    for (const auto& kv : node) {
      const YAML::Node& key_node = kv.first;
      const YAML::Node& value = kv.second;
      const std::string key_where = location(file, key_node.Mark());
      if (!key_node.IsScalar()) fail(key_where, "keys must be plain names");
      const std::string key = key_node.Scalar();
      const std::string path = prefix.empty() ? key : prefix + "." + key;
      if (prefix.empty() && key == "base") continue;  // handled by load_file
      if (!local.insert(key).second) fail(key_where, path + ": duplicate key");
      if (schema_.find(path) != nullptr) {
        // An empty value has no position of its own (yaml-cpp points past it): blame the key.
        out[path] = Entry{value, value.IsNull() ? key_where : location(file, value.Mark())};
      } else if (schema_.is_section(path)) {
        if (value.IsMap()) {
          flatten(value, path, file, out);
        } else if (!value.IsNull()) {
          fail(location(file, value.Mark()), path + ": expected a mapping of keys under '" + path +
                                                 ":', got " + internal::describe(value));
        }
      } else if (prefix.empty()) {
        fail(key_where, "unknown section '" + key + "'" + did_you_mean(key, schema_.sections()) +
                            " (sections: " + join(schema_.sections()) + ")");
      } else {
        fail(key_where, "unknown key '" + path + "'" + did_you_mean(path, schema_.paths()));
      }
    }
  }

  // Loads `path` and its base chain (base underneath). `chain` detects cycles.
  Entries load_file(const fs::path& path, std::vector<fs::path> chain) {
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(path, ec);
    const std::string display = display_config(path);
    for (const auto& p : chain) {
      if (p == canonical) {
        std::vector<std::string> names;
        for (const auto& q : chain) names.push_back(display_config(q));
        names.push_back(display);
        fail(display, "base: cycle " + join(names, " -> "));
      }
    }
    chain.push_back(canonical);
    YAML::Node root = read_yaml(path, display);
    if (root.IsNull()) {
      // An empty file (or only comments) is almost always a mistake: a truncated or wrong file.
      fail(display,
           "the config file is empty (no sections): give at least one section such as "
           "'fabric:', or leave out --config to run with the defaults");
    }
    return load_node(root, display, path.parent_path(), chain);
  }

  Entries load_node(const YAML::Node& root, const std::string& display, const fs::path& dir,
                    const std::vector<fs::path>& chain) {
    if (root.IsNull()) return {};
    if (!root.IsMap()) {
      fail(location(display, root.Mark()),
           "a config must be a mapping of sections (fabric:, data:, ...), got " +
               internal::describe(root));
    }
    Entries entries;
    if (const YAML::Node base = root["base"]) {
      const std::string where = location(display, base.Mark());
      if (!base.IsScalar() || base.Scalar().empty())
        fail(where, "base: expected a file name like 'single_cpu.yaml'");
      const fs::path found = find_config(
          base.Scalar(), {fs::path(base.Scalar()).is_absolute() ? fs::path() : dir / base.Scalar()},
          where + ": base");
      entries = load_file(found, chain);
    }
    Entries own;
    flatten(root, "", display, own);
    for (auto& [k, v] : own) entries[k] = std::move(v);
    return entries;
  }

  void apply_override(const std::string& text, Entries& entries) {
    const auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      fail("command line",
           "'" + text + "' is not an override: write key=value (e.g. optimizer.lr=0.2)");
    }
    const std::string path = text.substr(0, eq), raw = text.substr(eq + 1);
    // YAML reads bytes that are not UTF-8 as nothing ("no value given" named the wrong fault).
    if (const size_t bad = first_invalid_utf8(raw); bad != std::string::npos)
      fail("command line", path + ": the value's byte " + std::to_string(bad + 1) + " of " +
                               std::to_string(raw.size()) +
                               " is not UTF-8: give the value as UTF-8 text");
    YAML::Node value;
    try {
      value = YAML::Load(raw);
    } catch (const YAML::Exception& e) {
      fail("command line", path + ": '" + raw + "' is not a YAML value (" + e.msg + ")");
    }
    // " #" starts a YAML comment: on a command line it cut the value silently ('def # x' became
    // 'def'). The first '#' after a space or tab whose text before it reads as the same value was
    // such a cut (inside quotes, the text before it does not parse so).
    size_t hash = raw.find('#');
    while (hash != std::string::npos &&
           !(hash > 0 && (raw[hash - 1] == ' ' || raw[hash - 1] == '\t')))
      hash = raw.find('#', hash + 1);
    if (hash != std::string::npos) {
      bool cut = false;
      try {
        cut = YAML::Dump(YAML::Load(raw.substr(0, hash))) == YAML::Dump(value);
      } catch (const YAML::Exception&) {
      }
      if (cut)
        fail("command line", path + ": YAML reads ' #' in '" + raw +
                                 "' as the start of a comment, which would drop the rest; quote "
                                 "the value: " +
                                 path + "='\"" + raw + "\"'");
    }
    if (schema_.find(path) != nullptr) {
      entries[path] = Entry{value, "command line"};
    } else if (schema_.is_section(path) && value.IsMap()) {
      Entries nested;
      flatten(value, path, "command line", nested);
      for (auto& [k, v] : nested) entries[k] = Entry{v.value, "command line"};
    } else {
      fail("command line", "unknown key '" + path + "'" + did_you_mean(path, schema_.paths()));
    }
  }

  // Validates and canonicalizes every entry, then fills defaults.
  Entries resolve(Entries entries) {
    Entries out;
    for (const auto& path : schema_.paths()) {
      const KeySpec& spec = *schema_.find(path);
      auto it = entries.find(path);
      if (it == entries.end()) {
        out[path] = Entry{internal::normalize_value(spec, YAML::Load(spec.default_text())).value,
                          "default"};
        continue;
      }
      auto checked = internal::normalize_value(spec, it->second.value);
      if (!checked.error.empty()) fail(it->second.origin, path + ": " + checked.error);
      out[path] = Entry{checked.value, it->second.origin};
    }
    return out;
  }

 private:
  const ConfigSchema& schema_;
};

}  // namespace

// The keys read through any copy of a Config (Config::was_read, unread_keys).
struct ReadKeys {
  std::mutex mutex;
  std::set<std::string> keys;
};

struct Config::Impl {
  ConfigSchema schema;
  Entries entries;
  std::string file;
  std::vector<std::string> overrides;
  std::string yaml;
  std::string hash;
  std::shared_ptr<ReadKeys> read = std::make_shared<ReadKeys>();
};

namespace {

Config::Impl build_impl(const ConfigSchema& schema, Entries raw,
                        const std::vector<std::string>& overrides, std::string file) {
  Loader loader(schema);
  for (const auto& o : overrides) loader.apply_override(o, raw);
  Config::Impl impl;
  impl.schema = schema;
  impl.entries = loader.resolve(std::move(raw));
  impl.file = std::move(file);
  impl.overrides = overrides;

  YAML::Node root(YAML::NodeType::Map);
  for (const auto& path : schema.paths()) {
    YAML::Node node = root;
    std::stringstream parts(path);
    std::string part;
    std::vector<std::string> names;
    while (std::getline(parts, part, '.')) names.push_back(part);
    // Walk/create nested maps; yaml-cpp nodes are references, so reassigning `node` descends.
    for (size_t i = 0; i + 1 < names.size(); ++i) {
      if (!node[names[i]]) node[names[i]] = YAML::Node(YAML::NodeType::Map);
      node.reset(node[names[i]]);
    }
    node[names.back()] = impl.entries.at(path).value;
  }
  YAML::Emitter out;
  out << root;
  impl.yaml = std::string(out.c_str()) + "\n";
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(fnv1a64(impl.yaml)));
  impl.hash = hex;
  return impl;
}

}  // namespace

Config Config::load(const std::string& file, const std::vector<std::string>& overrides,
                    const ConfigSchema& schema) {
  Loader loader(schema);
  const fs::path found = find_config(file, {}, "--config");
  Entries raw = loader.load_file(found, {});
  return Config(std::make_shared<const Impl>(
      build_impl(schema, std::move(raw), overrides, display_config(found))));
}

Config Config::parse(const std::string& yaml, const std::vector<std::string>& overrides,
                     const ConfigSchema& schema, const std::string& name) {
  Loader loader(schema);
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    fail(location(name, e.mark), "YAML syntax error: " + e.msg);
  }
  Entries raw = loader.load_node(root, name, working_directory(), {});
  return Config(std::make_shared<const Impl>(build_impl(schema, std::move(raw), overrides, name)));
}

Config Config::defaults(const ConfigSchema& schema, const std::vector<std::string>& overrides) {
  return Config(std::make_shared<const Impl>(build_impl(schema, {}, overrides, "")));
}

Config Config::from_command_line(int argc, char** argv, const ConfigSchema& schema) {
  const CommandLine cl = parse_command_line(argc, argv);
  return cl.config_file.empty() ? defaults(schema, cl.overrides)
                                : load(cl.config_file, cl.overrides, schema);
}

namespace {

void mark_read(const Config::Impl& impl, const std::string& path) {
  std::lock_guard<std::mutex> lock(impl.read->mutex);
  impl.read->keys.insert(path);
}

const Entry& entry_of(const Config::Impl& impl, const std::string& path, KeyType want,
                      std::initializer_list<KeyType> also = {}) {
  const KeySpec* spec = impl.schema.find(path);
  if (spec == nullptr) throw Error("Config: no key '" + path + "' in the schema");
  mark_read(impl, path);
  bool ok = spec->type() == want;
  for (KeyType t : also) ok |= spec->type() == t;
  if (!ok)
    throw Error("Config: '" + path + "' is " + spec->type_name() + ", not the type asked for");
  return impl.entries.at(path);
}

}  // namespace

bool Config::get_bool(const std::string& path) const {
  return entry_of(*impl_, path, KeyType::kBool).value.as<bool>();
}

int64_t Config::get_int(const std::string& path) const {
  const Entry& e = entry_of(*impl_, path, KeyType::kInt);
  if (e.value.Scalar() == "auto")
    throw Error("Config: '" + path + "' is auto; the program resolves it (Config::is_auto)");
  return e.value.as<int64_t>();
}

bool Config::is_auto(const std::string& path) const {
  const KeySpec* spec = impl_->schema.find(path);
  if (spec == nullptr) throw Error("Config: no key '" + path + "' in the schema");
  mark_read(*impl_, path);
  const Entry& e = impl_->entries.at(path);
  return e.value.IsScalar() && e.value.Scalar() == "auto";
}

double Config::get_double(const std::string& path) const {
  return std::strtod(
      entry_of(*impl_, path, KeyType::kFloat, {KeyType::kInt}).value.Scalar().c_str(), nullptr);
}

std::string Config::get_string(const std::string& path) const {
  return entry_of(*impl_, path, KeyType::kString, {KeyType::kChoice}).value.Scalar();
}

std::vector<double> Config::get_double_list(const std::string& path) const {
  std::vector<double> out;
  for (const auto& item : entry_of(*impl_, path, KeyType::kFloatList).value)
    out.push_back(std::strtod(item.Scalar().c_str(), nullptr));
  return out;
}

std::vector<std::string> Config::get_string_list(const std::string& path) const {
  std::vector<std::string> out;
  for (const auto& item :
       entry_of(*impl_, path, KeyType::kChoiceList, {KeyType::kStringList}).value)
    out.push_back(item.Scalar());
  return out;
}

DeviceRequest Config::get_devices(const std::string& path) const {
  const YAML::Node& v = entry_of(*impl_, path, KeyType::kDevices).value;
  DeviceRequest r;
  if (v.IsSequence()) {
    for (const auto& id : v) r.ids.push_back(id.as<int64_t>());
    r.count = static_cast<int64_t>(r.ids.size());
  } else if (v.Scalar() == "auto") {
    r.is_auto = true;
  } else {
    r.count = v.as<int64_t>();
  }
  return r;
}

std::string Config::get_text(const std::string& path) const {
  if (impl_->schema.find(path) == nullptr)
    throw Error("Config: no key '" + path + "' in the schema");
  mark_read(*impl_, path);
  const YAML::Node& v = impl_->entries.at(path).value;
  return v.IsScalar() ? v.Scalar() : internal::describe(v);
}

std::string Config::origin(const std::string& path) const {
  if (impl_->schema.find(path) == nullptr)
    throw Error("Config: no key '" + path + "' in the schema");
  return impl_->entries.at(path).origin;
}

bool Config::was_read(const std::string& path) const {
  std::lock_guard<std::mutex> lock(impl_->read->mutex);
  return impl_->read->keys.count(path) > 0;
}

namespace {

// Whether `value` says what the key's default says (numbers compared as numbers: 0.0 is 0).
bool is_default_value(const KeySpec& spec, const YAML::Node& value) {
  YAML::Node fallback;
  try {
    fallback = YAML::Load(spec.default_text());
  } catch (const YAML::Exception&) {
    return false;
  }
  if (value.IsScalar() && fallback.IsScalar()) {
    if (value.Scalar() == fallback.Scalar()) return true;
    char *end_a = nullptr, *end_b = nullptr;
    const double a = std::strtod(value.Scalar().c_str(), &end_a);
    const double b = std::strtod(fallback.Scalar().c_str(), &end_b);
    return !value.Scalar().empty() && !fallback.Scalar().empty() && *end_a == '\0' &&
           *end_b == '\0' && a == b;
  }
  return internal::describe(value) == internal::describe(fallback);
}

}  // namespace

std::vector<UnreadKey> Config::unread_keys() const {
  std::vector<UnreadKey> out;
  std::lock_guard<std::mutex> lock(impl_->read->mutex);
  for (const auto& path : impl_->schema.paths()) {
    const Entry& e = impl_->entries.at(path);
    if (e.origin == "default" || impl_->read->keys.count(path)) continue;
    if (is_default_value(*impl_->schema.find(path), e.value)) continue;
    out.push_back(
        {path, e.value.IsScalar() ? e.value.Scalar() : internal::describe(e.value), e.origin});
  }
  return out;
}

ConfigError Config::error_at(const std::string& path, const std::string& message) const {
  return ConfigError(origin(path) + ": " + path + ": " + message);
}

std::string Config::to_yaml() const { return impl_->yaml; }
std::string Config::hash() const { return impl_->hash; }
const std::string& Config::file() const { return impl_->file; }
const std::vector<std::string>& Config::overrides() const { return impl_->overrides; }
const ConfigSchema& Config::schema() const { return impl_->schema; }

}  // namespace fabric
