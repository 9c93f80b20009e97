#include "fabric/checkpoint/output_check.h"

#include <algorithm>
#include <fstream>
#include <string_view>

#include "fabric/checkpoint/safetensors.h"
#include "fabric/checkpoint/sharded.h"
#include "fabric/core/error.h"

namespace fs = std::filesystem;

namespace fabric {
namespace {

// True when `dir` holds a checkpoint: a .ckpt file or folder, or a sharded folder.
bool holds_checkpoints(const fs::path& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.path().extension() == ".ckpt" || is_sharded_checkpoint(entry.path())) return true;
  }
  return false;
}

void check_one(const fs::path& output, const std::string& output_what,
               const std::vector<InputPath>& inputs) {
  const fs::path path = fs::absolute(output).lexically_normal();
  const std::string out = path.string();
  const std::string fix = "; choose another " + output_what;
  check_output_path(path, output_what, inputs);
  if (path.extension() == ".ckpt")
    throw Error(out +
                ": is a checkpoint's name (.ckpt); the output would be written over it or "
                "be taken for one" +
                fix);
  for (fs::path dir = path.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    if (dir.extension() == ".ckpt" || is_sharded_checkpoint(dir))
      throw Error(out + ": lies inside the checkpoint folder " + dir.string() +
                  ", which writing would damage" + fix + " outside it");
    if (dir == dir.parent_path()) break;
  }
  if (path.filename() == "latest" && holds_checkpoints(path.parent_path()))
    throw Error(out + ": is the marker naming the newest checkpoint of " +
                path.parent_path().string() + ", which writing would replace" + fix);
}

}  // namespace

void check_output(const fs::path& output, const std::string& output_what,
                  const std::vector<InputPath>& inputs, bool folder,
                  const std::vector<std::string>& written) {
  std::error_code ec;
  if (!folder && fs::is_directory(output, ec))
    throw Error(output.string() + ": is a folder; give a file name as " + output_what);
  if (folder && fs::exists(output, ec) && !fs::is_directory(output, ec))
    throw Error(output.string() + ": is " + file_kind(output) +
                ", not a folder; give a folder as " + output_what);
  check_one(output, output_what, inputs);
  if (folder && is_sharded_checkpoint(output))
    throw Error(output.string() +
                ": is a sharded checkpoint folder, which writing would damage; choose another " +
                output_what);
  for (const std::string& name : written) check_one(output / name, output_what, inputs);
}

void check_weights_output(const fs::path& output, const std::string& output_what,
                          const std::vector<InputPath>& inputs) {
  check_output(output, output_what, inputs);
  std::error_code ec;
  if (!fs::is_regular_file(output, ec) || fs::file_size(output, ec) == 0) return;
  char head[9] = {};
  std::ifstream in(output, std::ios::binary);
  in.read(head, sizeof head);
  const std::string_view bytes(head,
                               static_cast<size_t>(std::max<std::streamsize>(in.gcount(), 0)));
  if (looks_like_safetensors(bytes) || bytes.substr(0, 4) == std::string_view("PK\3\4", 4)) return;
  throw Error(output.string() +
              ": is an existing file that is not a weights file (neither .safetensors nor a "
              "torch.save zip), which writing would replace; choose another " +
              output_what + " or remove the file first");
}

const std::map<std::string, std::string>& export_metadata() {
  static const std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                              {"exported_by", "fabric++"}};
  return metadata;
}

bool is_earlier_export(const fs::path& folder) {
  std::error_code ec;
  bool marked = false;
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (entry.path().extension() != ".safetensors") continue;
    if (!is_safetensors_file(entry.path())) return false;
    try {
      const auto metadata = load_safetensors(entry.path()).metadata;
      const auto it = metadata.find("exported_by");
      if (it == metadata.end() || it->second != export_metadata().at("exported_by")) return false;
      marked = true;
    } catch (const Error&) {
      return false;  // a damaged file is no export of ours (ours are written atomically)
    }
  }
  return marked;
}

bool is_model_export_file(const std::string& name) {
  const auto ends_with = [&](const std::string& tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name == "config.json" || name == "model.safetensors" ||
         name == "model.safetensors.index.json" ||
         (name.rfind("model-", 0) == 0 && ends_with(".safetensors"));
}

bool is_adapter_export_file(const std::string& name) {
  return name == "adapter_config.json" || name == "adapter_model.safetensors";
}

void check_export_folder(const fs::path& folder, const std::string& output_what) {
  std::error_code ec;
  if (!fs::exists(folder, ec)) return;
  if (!fs::is_directory(folder, ec))
    throw Error(folder.string() + ": is " + file_kind(folder) + ", not a folder; choose a new or " +
                "empty folder as " + output_what);
  if (fs::is_empty(folder, ec) || is_earlier_export(folder)) return;
  // What it holds, a few names, sorted: the message says what would be lost.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder, ec))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  std::string held;
  for (size_t i = 0; i < names.size() && i < 3; ++i) held += (i ? ", " : "") + names[i];
  if (names.size() > 3) held += ", ... (" + std::to_string(names.size()) + " entries)";
  const bool model = std::any_of(names.begin(), names.end(), [](const std::string& n) {
    return n == "config.json" || n == "adapter_config.json" ||
           fs::path(n).extension() == ".safetensors";
  });
  throw Error(folder.string() + ": " +
              (model ? "holds a model this project did not export (" + held +
                           "; no export mark in its weights), which the export would replace"
                     : "is not empty and not an earlier export (" + held + ")") +
              "; choose a new or empty folder as " + output_what +
              (model ? " (or remove those files first)" : ""));
}

}  // namespace fabric
