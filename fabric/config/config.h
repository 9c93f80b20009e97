// fabric::Config: a validated, fully resolved YAML configuration.
//
// Sources, lowest to highest priority: the schema's defaults; the `base:` chain of the config file
// (`base: other.yaml` merges other.yaml underneath, recursively); the file itself; command-line
// overrides `key=value` (values are YAML: `fabric.devices=[0,1]`, `optimizer.lr=2e-3`).
//
// Every key is checked against a ConfigSchema. Any problem throws fabric::ConfigError with one line
// naming where the bad value came from:
//   configs/x.yaml:7:14: fabric.precision: '16-mixd' is not a precision; did you mean '16-mixed'?
//   (...) command line: optimizer.lr: 'fast' is not a number
//
// Config files are found (Config::load) by trying, in order: the path itself if absolute; relative
// to the directory the command was run in (BUILD_WORKING_DIRECTORY under `bazel run`); in
// $FABRIC_CONFIG_DIR (set by a bundle's run.sh); in the workspace's configs/ (`bazel run`); in the
// binary's runfiles configs/. A `base:` is looked up next to the including file first.
//
// A Config is immutable and cheap to copy (shared state); safe to read from many threads.
//
// Example:
//   fabric::Config config = fabric::Config::load("fashion_mnist.yaml", {"optimizer.lr=0.05"},
//                                                fabric::training_schema());
//   double lr = config.get_double("optimizer.lr");
#ifndef FABRIC_CONFIG_CONFIG_H_
#define FABRIC_CONFIG_CONFIG_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fabric/config/schema.h"
#include "fabric/config/standard_keys.h"
#include "fabric/core/error.h"

namespace fabric {

// `fabric.devices` as requested (before the Connector resolves it against the machine).
struct DeviceRequest {
  bool is_auto = false;      // "auto"
  int64_t count = 0;         // N ≥ 1, or -1 for all (when ids is empty and !is_auto)
  std::vector<int64_t> ids;  // explicit ids [0, 1]
};

// A key the config sets that the program never read (Config::unread_keys).
struct UnreadKey {
  std::string path;    // "trainer.ema_decay"
  std::string value;   // its YAML text, "0.999"
  std::string origin;  // "configs/x.yaml:7:14" or "command line"
};

class Config {
 public:
  // Loads `file` (searched as described above) and applies `overrides`. Throws ConfigError.
  static Config load(const std::string& file, const std::vector<std::string>& overrides,
                     const ConfigSchema& schema);
  // Same from YAML text; `name` stands for the file in messages. A `base:` is searched from the
  // working directory.
  static Config parse(const std::string& yaml, const std::vector<std::string>& overrides,
                      const ConfigSchema& schema, const std::string& name = "<config>");
  // Defaults plus overrides, no file.
  static Config defaults(const ConfigSchema& schema,
                         const std::vector<std::string>& overrides = {});
  // parse_command_line() then load() (or defaults() without --config). Throws ConfigError.
  static Config from_command_line(int argc, char** argv,
                                  const ConfigSchema& schema = training_schema());

  // Typed access. REQUIRES: `path` is declared with the matching type (else fabric::Error).
  bool get_bool(const std::string& path) const;
  int64_t get_int(const std::string& path) const;
  // A key that is `auto` (KeySpec::or_auto, fabric.devices' auto): get_int throws for it.
  bool is_auto(const std::string& path) const;
  double get_double(const std::string& path) const;       // kFloat and kInt keys
  std::string get_string(const std::string& path) const;  // kString and kChoice keys
  std::vector<double> get_double_list(const std::string& path) const;
  // kChoiceList and kStringList keys.
  std::vector<std::string> get_string_list(const std::string& path) const;
  DeviceRequest get_devices(const std::string& path) const;

  // The canonical YAML text of any value ("16-mixed", "0.1", "[0, 1]").
  std::string get_text(const std::string& path) const;
  // Where the value came from: "configs/x.yaml:7:14", "command line", or "default".
  std::string origin(const std::string& path) const;
  // A ConfigError located at `path`'s origin: "configs/x.yaml:7:14: fabric.accelerator: <message>".
  ConfigError error_at(const std::string& path, const std::string& message) const;

  // Read tracking, shared by every copy of this Config: each typed get_*, is_auto and get_text
  // marks its key read. Fabric reports the keys a config set that nothing read when the function
  // given to Fabric::launch returns (fabric.strict_keys), and applies some keys a program leaves
  // unread itself (docs/training.md, "Keys your loop reads").
  bool was_read(const std::string& path) const;
  // The keys set by the config file, its base chain or the command line to a value other than
  // their default that no get_* has read yet, in schema order.
  std::vector<UnreadKey> unread_keys() const;

  // The resolved configuration (every key, defaults filled in, in schema order) as YAML.
  std::string to_yaml() const;
  // Stable 16-hex-digit hash of to_yaml(): equal configs hash equally whatever their key order,
  // base chain or override spelling.
  std::string hash() const;
  // The main config file as given in messages ("" for parse()/defaults()).
  const std::string& file() const;
  const std::vector<std::string>& overrides() const;
  const ConfigSchema& schema() const;

  struct Impl;  // opaque

 private:
  explicit Config(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// The command line of a Fabric program: flags (gflags) then overrides.
//   --config=FILE      config file (see Config::load); without it the schema's defaults apply.
//   --print_config     print the resolved config and exit 0.
//   --help             print flags and every config key with its default, exit 0.
//   key=value ...      overrides.
struct CommandLine {
  std::string config_file;
  bool print_config = false;
  bool help = false;
  std::vector<std::string> overrides;
};

// Parses argv without modifying it. Unknown flags (with a did-you-mean), a flag without its value
// and positional arguments that are not key=value throw ConfigError ("command line: ...").
CommandLine parse_command_line(int argc, char** argv);

// Every leaf of a YAML config (e.g. Config::to_yaml() or --print_config output) as dotted key →
// canonical YAML text: {"optimizer.lr": "0.1", "fabric.devices": "[0, 1]"}. Throws ConfigError
// when `yaml` is not YAML.
std::map<std::string, std::string> config_leaves(const std::string& yaml);

// The keys whose values differ between two resolved configs (Config::to_yaml() texts), in key
// order, as "optimizer.lr 0.1 → 0.05" ("(absent)" for a key only one side has). Keys in
// `ignored_sections` (e.g. "checkpoint") and below are left out.
std::vector<std::string> config_differences(const std::string& old_yaml,
                                            const std::string& new_yaml,
                                            const std::vector<std::string>& ignored_sections = {});

// --help text: usage, flags, and every key of `schema` with type, default and documentation.
std::string describe_schema(const ConfigSchema& schema, const std::string& program);

}  // namespace fabric

#endif  // FABRIC_CONFIG_CONFIG_H_
