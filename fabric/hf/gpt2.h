// Hugging Face GPT-2 folders (model_type gpt2, GPT2LMHeadModel) as fabric::models::GPT:
// config.json → GPTConfig, and the weights renamed to the GPT's nanoGPT names with GPT-2's Conv1D
// weights ([in, out]) transposed to Linear's [out, in].
//
//   fabric::models::GPT model = fabric::hf::load_gpt2("gpt2");  // float32 parameters
#ifndef FABRIC_HF_GPT2_H_
#define FABRIC_HF_GPT2_H_

#include <filesystem>

#include "fabric/hf/weights.h"
#include "fabric/models/gpt.h"

namespace fabric::hf {

// The GPTConfig of a GPT-2 config.json (`path` is the file or its folder). Read: model_type (gpt2),
// n_embd, n_layer, n_head, n_positions (→ block_size), vocab_size (as the file says, unpadded:
// 50257 for GPT-2), layer_norm_epsilon (default 1e-5), activation_function (gelu_new and
// gelu_pytorch_tanh → gelu "tanh", gelu → "none"; default gelu_new), resid_pdrop (→ dropout,
// default 0.1: the GPT has one dropout rate, used for the embeddings, attention and residuals;
// embd_pdrop and attn_pdrop are not read). bias is true (GPT-2 has biases).
// fabric::Error "PATH: KEY: problem; fix" for: a model_type other than gpt2; a missing or
// mistyped size; another activation_function; n_inner other than null or 4 · n_embd;
// tie_word_embeddings false (the GPT's output is tied to wte); scale_attn_weights false;
// scale_attn_by_inverse_layer_idx, reorder_and_upcast_attn or add_cross_attention true;
// n_embd not a multiple of n_head.
fabric::models::GPTConfig read_gpt2_config(const std::filesystem::path& path);

// A GPT-2 folder's tensors (read_weights) under the GPT's names: "transformer." added where the
// file lacks it (the original openai-community/gpt2 file has h.0.attn.c_attn.weight, transformers
// 5's save_pretrained transformer.h.0.attn.c_attn.weight); the Conv1D weights (attn.c_attn,
// attn.c_proj, mlp.c_fc, mlp.c_proj) transposed, as views; the attn.bias and attn.masked_bias
// buffers (causal masks) and lm_head.weight (tied to wte) dropped. `file` keeps each tensor's
// file under its new name, for errors.
Weights gpt2_weights(const Weights& hf_folder_weights);

// Copies the folder's weights into `model` (gpt2_weights, then fabric/hf/weights.h load_weights:
// errors name the file and the tensor by its GPT name; a wrong shape is given transposed for the
// Conv1D weights).
void load_gpt2_weights(fabric::models::GPTImpl& model, const std::filesystem::path& folder);

// A GPT built from folder/config.json with the folder's weights (their sizes checked first).
fabric::models::GPT load_gpt2(const std::filesystem::path& folder);

// check_config_sizes (fabric/hf/weights.h) for a GPT-2 config.json: n_layer against the weights'
// (transformer.)h.N, vocab_size × n_embd against (transformer.)wte.weight.
void check_gpt2_sizes(const fabric::models::GPTConfig& config, const Weights& weights,
                      const std::filesystem::path& config_json);

}  // namespace fabric::hf

#endif  // FABRIC_HF_GPT2_H_
