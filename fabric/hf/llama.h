// Hugging Face Llama-family folders (model_type llama, qwen2, mistral) as fabric::models::Llama:
// config.json → LlamaConfig, and the weights by name (the model's names are Hugging Face's).
//
//   fabric::models::Llama model = fabric::hf::load_llama("Qwen2.5-0.5B");  // float32 parameters
#ifndef FABRIC_HF_LLAMA_H_
#define FABRIC_HF_LLAMA_H_

#include <filesystem>

#include "fabric/hf/weights.h"
#include "fabric/models/llama.h"

namespace fabric::hf {

// The LlamaConfig of a config.json (`path` is the file or its folder). Read: model_type,
// vocab_size, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: the heads), head_dim (default hidden_size / heads), rms_norm_eps,
// rope_theta and the rope scaling (from rope_parameters as transformers 5 writes it, else
// rope_scaling and rope_theta; rope_type default or llama3), max_position_embeddings,
// attention_bias (qwen2: q/k/v biases always), tie_word_embeddings, torch_dtype (or dtype),
// sliding_window (mistral; qwen2 with use_sliding_window).
// fabric::Error "PATH: KEY: problem; fix" for: a model_type other than llama, qwen2, mistral; a
// missing or mistyped required key; a feature not implemented (another rope_type, hidden_act other
// than silu, mlp_bias, attention_dropout, quantization_config); inconsistent sizes.
fabric::models::LlamaConfig read_llama_config(const std::filesystem::path& path);

// The folder's tensors the model has (views, files kept for errors): rotary inv_freq buffers some
// writers save dropped, and lm_head.weight when the config ties it to the embedding.
Weights llama_weights(const Weights& folder, const fabric::models::LlamaConfig& config);

// Copies the folder's weights into `model` (fabric/hf/weights.h: read_weights, load_weights; the
// errors name the file and tensor). Tied models' files have no lm_head.weight (one there is
// ignored); rotary inv_freq buffers some writers save are ignored.
void load_llama_weights(fabric::models::LlamaImpl& model, const std::filesystem::path& folder);

// A Llama built from folder/config.json with the folder's weights (their sizes checked first).
fabric::models::Llama load_llama(const std::filesystem::path& folder);

// check_config_sizes (fabric/hf/weights.h) for a Llama-family config.json: num_hidden_layers
// against the weights' model.layers.N, vocab_size × hidden_size against model.embed_tokens.weight.
void check_llama_sizes(const fabric::models::LlamaConfig& config, const Weights& weights,
                       const std::filesystem::path& config_json);

}  // namespace fabric::hf

#endif  // FABRIC_HF_LLAMA_H_
