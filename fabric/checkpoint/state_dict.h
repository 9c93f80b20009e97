// Model weights as files PyTorch reads and writes: a state dict (name → tensor) in torch.save's
// zip layout, so
//   - a file written here is read in Python by torch.load(path, weights_only=True) as a dict;
//   - a file written in Python by torch.save(model.state_dict(), path) is read here.
// Names are the module's parameter and buffer names as torch::nn::Module::named_parameters /
// named_buffers give them ("features.0.weight", "bn.running_mean", ...), the names a Python model
// of the same structure uses.
//
// Reading never executes code from the file: a small pickle interpreter (torch_pickle.h) knows only
// dicts/OrderedDicts, tuples, lists, strings, numbers and tensors; a file naming any other Python
// global (a function, a class) is refused with an error naming it.
#ifndef FABRIC_CHECKPOINT_STATE_DICT_H_
#define FABRIC_CHECKPOINT_STATE_DICT_H_

#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fabric {

using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

// Parameters then buffers of `module`, by name (undefined ones skipped), detached.
StateDict state_dict(const torch::nn::Module& module);

// Writes `tensors` (on any device; saved as CPU tensors) to `path`, crash-safe (temporary file,
// fsync, rename; see fabric/core/atomic_file.h): a .safetensors file when `path` ends in
// .safetensors (safetensors.h), else torch.save's layout. Throws fabric::Error "cannot write
// PATH: ...".
void save_state_dict(const std::filesystem::path& path, const StateDict& tensors);

// The name → tensor entries of an archive's value (see archive.h); fabric::Error "SOURCE: not a
// state dict (...)" for anything else.
StateDict state_dict_from(const c10::IValue& value, const std::string& source);

// Reads a name → tensor dict (save_state_dict's, Python's torch.save(state_dict), or a
// .safetensors file, told apart by their first bytes whatever the file's name). Throws
// fabric::Error "PATH: ..." for a missing, truncated or foreign file.
StateDict load_state_dict_file(const std::filesystem::path& path);

// The name-mapping hook for weights written by another program (a Hugging Face checkpoint's
// "transformer.h.0.attn.c_attn.weight" for this model's "blocks.0.attn.qkv.weight"): each name
// replaced by rename(name), and the entry dropped when that is "". Throws fabric::Error naming
// both sources when two names map to one.
//   auto w = fabric::map_names(fabric::load_state_dict_file(path), [](const std::string& n) {
//     return n.rfind("transformer.", 0) == 0 ? n.substr(12) : n;
//   });
//   fabric::load_state_dict(*model, w, path);
StateDict map_names(StateDict tensors,
                    const std::function<std::string(const std::string&)>& rename);

// Copies `tensors` into the parameters and buffers of `module` (on their devices and dtypes).
// Strict: if any name is missing, unexpected or of another shape, nothing is copied and
// fabric::Error lists them all: "SOURCE: does not match the model: missing [a, b]; unexpected
// [c]; shape of d is [3, 4] in the file, [4, 4] in the model".
void load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                     const std::string& source);
// The same in two phases: checks now (throwing as above), copies when the result is called.
std::function<void()> prepare_load_state_dict(torch::nn::Module& module, const StateDict& tensors,
                                              const std::string& source);

// A parameter of which this process holds only a part (a sharding strategy's): given the file's
// value for it (the whole tensor, or a piece, fabric/checkpoint/sharded.h, of the shape the
// parameter has), the function that copies this process's part in. Throws fabric::Error (the
// caller adds the file and the name) for a piece that does not hold that part.
using PartialTarget = std::function<std::function<void()>(const c10::IValue& value)>;
// prepare_load_state_dict from a checkpoint's value (name → tensor, or a piece for the names of
// `partial`), the parameters named in `partial` written through it; checked the same way, except
// that a name given None is left as it is (not missing: a checkpoint of only some of a module's
// tensors, CheckpointState::add with `keep`).
std::function<void()> prepare_load_state_dict(const torch::nn::Module& module,
                                              const c10::IValue& value, const std::string& source,
                                              const std::map<std::string, PartialTarget>& partial);

}  // namespace fabric

#endif  // FABRIC_CHECKPOINT_STATE_DICT_H_
