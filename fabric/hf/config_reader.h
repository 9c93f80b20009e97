// Internal to fabric/hf: typed reads of a config.json's keys, each error one line
// "PATH: KEY: problem; fix" (fabric::Error). A null value counts as absent.
//
//   const ConfigReader r(json, "gpt2/config.json", "a GPT-2 config.json names it");
//   const int64_t n = r.integer("n_embd");           // missing → "...: n_embd: missing; ..."
//   const double eps = r.number("layer_norm_epsilon", 1e-5);
#ifndef FABRIC_HF_CONFIG_READER_H_
#define FABRIC_HF_CONFIG_READER_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

#include "fabric/core/error.h"
#include "fabric/core/json_object.h"

namespace fabric::hf {

class ConfigReader {
 public:
  // `missing`: the fix said for a required key that is absent.
  ConfigReader(const nlohmann::json& json, std::string path, std::string missing)
      : json_(json), path_(std::move(path)), missing_(std::move(missing)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& problem) const {
    throw Error(path_ + ": " + key + ": " + problem);
  }
  bool has(const std::string& key) const { return json_.contains(key) && !json_[key].is_null(); }
  const nlohmann::json& at(const std::string& key) const { return json_[key]; }

  int64_t integer(const std::string& key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!has(key)) {
      if (fallback) return *fallback;
      fail(key, "missing; " + missing_);
    }
    if (!json_[key].is_number_integer()) fail(key, json_[key].dump() + " is not an integer");
    return json_[key].get<int64_t>();
  }
  double number(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_number()) fail(key, json_[key].dump() + " is not a number");
    return json_[key].get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_boolean()) fail(key, json_[key].dump() + " is not true or false");
    return json_[key].get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!json_[key].is_string()) fail(key, json_[key].dump() + " is not a string");
    return json_[key].get<std::string>();
  }

 private:
  const nlohmann::json& json_;
  std::string path_, missing_;
};

// The JSON object in `given` (a config.json, or a folder holding one) and the file's path;
// fabric::Error "PATH: cannot read" / "PATH: not JSON (line L, column C: why)" / "PATH: a JSON
// array, not an object" (fabric/core/json_object.h).
inline std::pair<nlohmann::json, std::string> read_config_json(const std::filesystem::path& given) {
  const std::filesystem::path path =
      std::filesystem::is_directory(given) ? given / "config.json" : given;
  return {read_json_object(path.string(), "; give a Hugging Face model's config.json"),
          path.string()};
}

}  // namespace fabric::hf

#endif  // FABRIC_HF_CONFIG_READER_H_
