// The one check for every path a program or tool writes (checkpoint.export_weights, ckpt
// consolidate's OUT, tools/prepare_text's --output, the sweep's folder): an output never
// overwrites an input (fabric/core/files.h: the same file, inside an input folder read whole, an
// existing file inside a data folder) or a checkpoint:
//   - a checkpoint's name (.ckpt), or anything inside a folder so named (a sharded checkpoint,
//     or one being written);
//   - anything inside a sharded checkpoint folder (manifest.json beside it), whatever its name;
//   - `latest`, the marker naming the newest checkpoint, in a folder that holds checkpoints.
// Called before any work, so a refused run has changed nothing.
#ifndef FABRIC_CHECKPOINT_OUTPUT_CHECK_H_
#define FABRIC_CHECKPOINT_OUTPUT_CHECK_H_

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "fabric/core/files.h"

namespace fabric {

// Throws fabric::Error "OUTPUT: <what it would overwrite>; <fix>". `folder`: the
// output is a folder the program writes files into (then each of `written`, names inside it, is
// checked too); else it is one file, and an existing folder there is refused.
void check_output(const std::filesystem::path& output, const std::string& output_what,
                  const std::vector<InputPath>& inputs, bool folder = false,
                  const std::vector<std::string>& written = {});

// The same for a weights file (checkpoint.export_weights, ckpt consolidate's OUT): besides the
// above, an existing file there is replaced only when it is a weights file itself (a .safetensors
// file or a torch.save zip): a token file, a config, a CSV is refused.
void check_weights_output(const std::filesystem::path& output, const std::string& output_what,
                          const std::vector<InputPath>& inputs);

// Export folders (Hugging Face folders, fabric/hf/export.h; peft adapters, fabric/nn/lora.h):
// every weights file an export writes carries export_metadata() in its safetensors header
// ("format": "pt", "exported_by": "fabric++"). That mark tells an earlier export, which a new one
// may replace, from a model downloaded or written by other code, which it may not (its
// config.json, weights and tokenizer would be replaced and lost).
const std::map<std::string, std::string>& export_metadata();

// True when `folder` holds .safetensors files directly and every one carries the export mark (a
// downloaded model beside which our adapter was copied is not an earlier export).
bool is_earlier_export(const std::filesystem::path& folder);

// The files each kind of export writes: a model's (config.json, model.safetensors, its index and
// shards) and a peft adapter's (adapter_config.json, adapter_model.safetensors). An export into an
// earlier one drops the other kind's files, so the folder never holds both (transformers would
// load it as base and adapter).
bool is_model_export_file(const std::string& name);
bool is_adapter_export_file(const std::string& name);

// Throws fabric::Error "FOLDER: ...; choose a new or empty folder as OUTPUT_WHAT ..." unless
// `folder` is absent, an empty folder or an earlier export. Called before any work (the programs,
// at their config) and again by the writers themselves.
void check_export_folder(const std::filesystem::path& folder, const std::string& output_what);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_OUTPUT_CHECK_H_
