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

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_OUTPUT_CHECK_H_
