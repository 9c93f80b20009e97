// The weights of a Hugging Face model folder (what save_pretrained(..., safe_serialization=True)
// writes): model.safetensors, or model.safetensors.index.json and the shards its weight_map names.
// Read memory-mapped through fabric/checkpoint/safetensors.h; each tensor remembers its file so
// errors can name it.
//
//   fabric::hf::Weights w = fabric::hf::read_weights("Qwen2.5-0.5B");
//   fabric::hf::load_weights(*model, w, "Qwen2.5-0.5B");   // by name, float32 from bf16 etc.
#ifndef FABRIC_HF_WEIGHTS_H_
#define FABRIC_HF_WEIGHTS_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fabric/checkpoint/state_dict.h"

namespace fabric::hf {

struct Weights {
  StateDict tensors;                                  // views of the memory-mapped files
  std::map<std::string, std::filesystem::path> file;  // each tensor's file
};

// The folder's tensors. fabric::Error naming the file: no weights in the folder (neither file, or
// only PyTorch's pytorch_model.bin), an index that is not JSON or has no weight_map, a shard the
// index names that is missing (with a tensor it should hold), a tensor the index places in a shard
// that lacks it, a tensor in two shards, or a file that is not a valid safetensors file.
Weights read_weights(const std::filesystem::path& folder);

// Copies `weights` into the parameters of `module` by name (converting floating dtypes: bf16 and
// fp16 files into float32 parameters). Names for which `ignore(name)` is true are skipped (e.g.
// buffers some writers save, like rotary inv_freq). Checked before anything is copied;
// fabric::Error, one line naming the file and the tensor, for the first of: a tensor the model
// does not have ("unexpected"), a tensor of another shape than the model's (which config.json
// decided), a parameter no file holds ("missing").
void load_weights(torch::nn::Module& module, const Weights& weights,
                  const std::filesystem::path& folder,
                  const std::function<bool(const std::string&)>& ignore = nullptr);

// load_weights' check without the copy: the tensors of `weights` that `module` takes, by name
// (views of the files; `ignore`d names dropped), after the same checks and errors. For a module
// whose parameters have their whole shapes (before setup; an empty init's meta tensors do), then
// copied by Fabric after setup, each rank only its part:
//   auto model = f.init_module([&] { return fabric::models::Llama(config); });
//   const fabric::StateDict kept = fabric::hf::checked_weights(*model, weights, folder);
//   f.setup(model, *optimizer);
//   f.load_weights(model, kept, folder.string());
StateDict checked_weights(const torch::nn::Module& module, const Weights& weights,
                          const std::filesystem::path& folder,
                          const std::function<bool(const std::string&)>& ignore = nullptr);

// The sizes config.json gives a model's layers and token embedding, checked against the weights
// before a model of those sizes is built: a config.json that disagrees with its weights (100000000
// layers over a file of 4, a vocabulary or width far above the file's) would otherwise build or
// allocate for minutes, or run out of memory, before load_weights names the first tensor that
// differs.
struct ConfigSizes {
  std::filesystem::path config;             // config.json, for the message
  std::vector<std::string> layer_prefixes;  // a layer's tensors are PREFIX N.*, e.g. model.layers.
  std::string layers_key;                   // e.g. num_hidden_layers
  int64_t layers = 0;
  std::vector<std::string> embedding_names;  // the token embedding, e.g. model.embed_tokens.weight
  std::string vocab_key, width_key;          // e.g. vocab_size, hidden_size
  int64_t vocab = 0, width = 0;
};

// fabric::Error, one line naming config.json, the keys and the weights' file, when the weights
// hold another number of layers (one more than the highest N of their layer tensors) or a token
// embedding of another shape than [vocab, width].
void check_config_sizes(const Weights& weights, const ConfigSizes& sizes);

}  // namespace fabric::hf

#endif  // FABRIC_HF_WEIGHTS_H_
