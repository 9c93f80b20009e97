// Model weights as files: a state dict (name → tensor) in torch.save's zip layout, written
// crash-safe. Python reads them: torch.load(path, weights_only=True) returns a dict name → tensor.
// Names are the module's parameter and buffer names as torch::nn::Module::named_parameters /
// named_buffers give them ("features.0.weight", "bn.running_mean", ...), the names a Python model
// of the same structure uses.
//
// Not yet (issue 5): reading Python's torch.save(model.state_dict()) — torch::pickle_load turns
// that OrderedDict (which carries _metadata) into None, which load_state_dict_file reports as an
// error; a small allow-listed unpickler of our own is the planned fix.
//
// Reading never executes code from the file: only PyTorch's data pickle (dicts, strings, tensors)
// is decoded; anything else is an error.
#ifndef FABRIC_CHECKPOINT_STATE_DICT_H_
#define FABRIC_CHECKPOINT_STATE_DICT_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fabric {

using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

// Parameters then buffers of `module`, by name (undefined ones skipped), detached.
StateDict state_dict(const torch::nn::Module& module);

// Writes `tensors` (on any device; saved as CPU tensors) to `path`, crash-safe (temporary file,
// fsync, rename; see fabric/core/atomic_file.h). Throws fabric::Error "cannot write PATH: ...".
void save_state_dict(const std::filesystem::path& path, const StateDict& tensors);

// Reads a name → tensor dict written by save_state_dict. Throws
// fabric::Error "PATH: ..." for a missing, truncated or foreign file.
StateDict load_state_dict_file(const std::filesystem::path& path);

// Copies `tensors` into the parameters and buffers of `module` (on their devices and dtypes).
// Strict: if any name is missing, unexpected or of another shape, nothing is copied and
// fabric::Error lists them all: "SOURCE: does not match the model: missing [a, b]; unexpected
// [c]; shape of d is [3, 4] in the file, [4, 4] in the model".
void load_state_dict(torch::nn::Module& module, const StateDict& tensors, const std::string& source);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_STATE_DICT_H_
