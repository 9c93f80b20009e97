// Saving a model as a Hugging Face folder that transformers.AutoModelForCausalLM.from_pretrained
// loads: config.json, and the weights as model.safetensors or, above max_shard_bytes, the shards
// model-00001-of-0000N.safetensors and model.safetensors.index.json (metadata.total_size,
// weight_map), as save_pretrained writes them.
//
//   fabric::hf::save_llama(model->config(), fabric::state_dict(*model), "out/qwen", 5'000'000'000);
//   fabric::hf::save_gpt2(gpt->config(), fabric::state_dict(*gpt), "out/gpt2", 5'000'000'000);
//
// `state` is the model's whole state under the model's own parameter names (what
// named_parameters gives on an unsharded model; ckpt consolidate's entry), in any floating dtype
// (all the same; config.json's torch_dtype says which) and on any device. fabric::Error, one
// line, before anything is written, for a tensor the config does not describe, one it describes
// that is missing, a shape the config contradicts, or mixed dtypes.
//
// Crash-safe: the folder is written under a temporary name beside it (.NAME.partial) and renamed
// into place, so `folder` holds either the old or the whole new export. An existing `folder` must
// be empty or an earlier export (its weights carry the export mark, fabric/checkpoint/
// output_check.h): its other files (tokenizer.json, ...) are kept, its config.json and weights
// replaced. Anything else there, a downloaded model's folder above all, is refused (fabric::Error
// "FOLDER: ...; fix").
#ifndef FABRIC_HF_EXPORT_H_
#define FABRIC_HF_EXPORT_H_

#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "fabric/checkpoint/state_dict.h"
#include "fabric/models/gpt.h"
#include "fabric/models/llama.h"

namespace fabric::hf {

// What save_llama and save_gpt2 take besides the model: keys merged into config.json last (e.g.
// bos_token_id, eos_token_id; a key with a null value removes it), and files copied into the
// folder (tokenizer.json, tokenizer_config.json, generation_config.json, ...; by their names).
struct ExportExtras {
  nlohmann::json config = nlohmann::json::object();
  std::vector<std::filesystem::path> copy_files;
};

// config.json of a LlamaConfig: architectures (LlamaForCausalLM, Qwen2ForCausalLM,
// MistralForCausalLM by model_type), sizes, rms_norm_eps, rope_theta and the llama3 scaling (as
// transformers 5's rope_parameters and transformers 4's rope_theta + rope_scaling), biases,
// tie_word_embeddings, the sliding window, torch_dtype. fabric::Error for what the model_type
// cannot express (q/k/v biases without o_proj's on llama or mistral; o_proj's on qwen2).
nlohmann::json llama_config_json(const fabric::models::LlamaConfig& config,
                                 const std::string& torch_dtype);

// config.json of a GPTConfig as GPT-2's (GPT2LMHeadModel): n_embd, n_layer, n_head, n_positions
// (block_size), vocab_size, layer_norm_epsilon, activation_function (gelu "tanh" → gelu_new,
// "none" → gelu), the dropouts (all three = dropout), tie_word_embeddings true.
nlohmann::json gpt2_config_json(const fabric::models::GPTConfig& config,
                                const std::string& torch_dtype);

// A Llama (llama, qwen2, mistral) as a Hugging Face folder; the names are already Hugging Face's.
// A tied model's lm_head.weight, if `state` has it, is not written (transformers ties it again).
void save_llama(const fabric::models::LlamaConfig& config, const fabric::StateDict& state,
                const std::filesystem::path& folder, int64_t max_shard_bytes,
                const ExportExtras& extras = {});

// A GPT as a GPT-2 folder: transformer.* names as transformers 5 writes them, the Linear weights
// of attn.c_attn, attn.c_proj, mlp.c_fc and mlp.c_proj transposed back to Conv1D's [in, out]
// (contiguous); a GPT without biases (config.bias false) gets zero biases (GPT-2 always has them).
void save_gpt2(const fabric::models::GPTConfig& config, const fabric::StateDict& state,
               const std::filesystem::path& folder, int64_t max_shard_bytes,
               const ExportExtras& extras = {});

// The files of a Hugging Face folder written crash-safely as above: config.json (`config`), the
// tensors (names as given) in one model.safetensors or in shards of at most max_shard_bytes (a
// tensor larger than that alone in its shard) with model.safetensors.index.json, and
// extras.copy_files. save_llama and save_gpt2 end here.
void save_hf_folder(const nlohmann::json& config, const fabric::StateDict& tensors,
                    const std::filesystem::path& folder, int64_t max_shard_bytes,
                    const std::vector<std::filesystem::path>& copy_files = {});

}  // namespace fabric::hf

#endif  // FABRIC_HF_EXPORT_H_
