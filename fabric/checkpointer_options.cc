// CheckpointerOptions: the checkpoint: section read into the options Checkpointer follows (the
// folder, the schedule, resume, and the export path checked against every input the run reads).
#include "fabric/checkpointer.h"

#include <string>
#include <utility>
#include <vector>

#include "fabric/checkpoint/output_check.h"
#include "fabric/core/paths.h"
#include "fabric/logging/run_dir.h"

namespace fabric {
namespace fs = std::filesystem;

namespace {

// `key`'s pattern with its {fields} replaced; ConfigError at `key` for a bad pattern.
std::string expand(const Config& c, const std::string& key,
                   const std::vector<std::pair<std::string, std::string>>& fields) {
  try {
    return expand_fields(c.get_string(key), fields);
  } catch (const Error& e) {
    throw c.error_at(key, e.what());
  }
}

}  // namespace

CheckpointerOptions CheckpointerOptions::from_config(const Config& c, const std::string& name,
                                                     const fs::path& run_dir) {
  CheckpointerOptions o;
  o.name = name;
  const std::vector<std::pair<std::string, std::string>> fields = {{"run_dir", run_dir.string()},
                                                                   {"name", name}};
  o.dir_pattern = c.get_string("checkpoint.dir");
  o.dir = absolute_from_working_directory(expand(c, "checkpoint.dir", fields));
  o.every_n_steps = c.get_int("checkpoint.every_n_steps");
  o.every_n_epochs = c.get_int("checkpoint.every_n_epochs");
  o.keep_last = c.get_int("checkpoint.keep_last");
  o.save_last = c.get_bool("checkpoint.save_last");
  o.async = c.get_bool("checkpoint.async");
  o.resume = c.get_string("checkpoint.resume");
  if (c.get_string("checkpoint.export_weights") != "none") {
    fs::path weights =
        absolute_from_working_directory(expand(c, "checkpoint.export_weights", fields));
    const std::string format = c.get_string("checkpoint.export_format");
    const bool safetensors = format == "safetensors";
    o.export_hf = format == "hf";
    // hf: a folder; the default name (weights.pt) loses its extension.
    if (o.export_hf && (weights.extension() == ".pt" || weights.extension() == ".safetensors"))
      weights.replace_extension();
    if (safetensors && weights.extension() == ".pt") weights.replace_extension(".safetensors");
    if (safetensors && weights.extension() != ".safetensors")
      throw c.error_at("checkpoint.export_weights",
                       weights.filename().string() +
                           " is not a .safetensors name while checkpoint.export_format is "
                           "safetensors; end it in .safetensors (or .pt, which becomes "
                           ".safetensors)");
    if (format == "pt" && weights.extension() == ".safetensors")
      throw c.error_at("checkpoint.export_weights",
                       weights.filename().string() +
                           " ends in .safetensors while checkpoint.export_format is pt; set "
                           "checkpoint.export_format: safetensors");
    // Never over an input or a checkpoint (fabric/checkpoint/output_check.h): the weights
    // written over step-N.ckpt, `latest` or the data's val.bin destroy them.
    // The run's own files too (written later: the weights would be written over them or they
    // over the weights).
    std::vector<InputPath> inputs = {{o.dir / "latest", "the marker of checkpoint.dir"},
                                     {run_dir / "config.yaml", "the run's config"},
                                     {run_dir / "summary.json", "the run's summary"},
                                     {run_dir / "metrics.csv", "the run's metrics"}};
    const auto string_key = [&](const std::string& key) {
      const KeySpec* spec = c.schema().find(key);
      return spec && (spec->type() == KeyType::kString) ? c.get_string(key) : std::string();
    };
    if (const std::string w = string_key("model.init_weights"); !w.empty() && w != "none")
      inputs.push_back({absolute_from_working_directory(w), "model.init_weights"});
    if (const std::string r = string_key("checkpoint.resume");
        !r.empty() && r != "none" && r != "auto")
      inputs.push_back({absolute_from_working_directory(r), "checkpoint.resume"});
    // A pretrained folder the run started from, and instruction data files (examples:finetune):
    // an export into the base model's folder would mix with (or replace) its weights.
    for (const char* key : {"model.pretrained", "data.train", "data.val"})
      if (const std::string in = string_key(key); !in.empty())
        inputs.push_back({absolute_from_working_directory(in), key});
    // The data folder's files (its val.bin), unless the weights go into this run's own folder
    // (a run folder inside data.root may replace its own earlier export).
    if (const std::string root = string_key("data.root");
        !root.empty() && !path_within(weights, run_dir))
      inputs.push_back({absolute_from_working_directory(root), "data.root", false});
    try {
      if (o.export_hf) {
        check_output(weights, "checkpoint.export_weights", inputs, /*folder=*/true,
                     {"config.json", "model.safetensors", "model.safetensors.index.json",
                      "adapter_config.json", "adapter_model.safetensors", "tokenizer.json"});
        // Into an earlier export only, never another model's folder (found now, not after
        // training).
        check_export_folder(weights, "checkpoint.export_weights");
      } else {
        check_weights_output(weights, "checkpoint.export_weights", inputs);
      }
    } catch (const Error& e) {
      throw c.error_at("checkpoint.export_weights", e.what());
    }
    o.export_weights = weights.string();
  }
  if (o.dir_pattern.find("{run_dir}") != std::string::npos)
    o.earlier_runs = RunDirectory::earlier_runs(c, name);
  return o;
}

std::vector<fs::path> CheckpointerOptions::search_dirs() const {
  if (dir_pattern.find("{run_dir}") == std::string::npos) return {dir};
  std::vector<fs::path> out;  // the pattern expanded once already (from_config): no error here
  for (const fs::path& run : earlier_runs.find())
    out.push_back(absolute_from_working_directory(
        expand_fields(dir_pattern, {{"run_dir", run.string()}, {"name", name}})));
  return out;
}

}  // namespace fabric
