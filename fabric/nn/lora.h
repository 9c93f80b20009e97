// fabric::nn LoRA (low-rank adapters, Hu et al. 2021) on a model's fabric::nn::Linear layers, as
// Hugging Face peft's LoraConfig does them, so an adapter trained here loads in peft and back.
//
//   fabric::nn::LoraOptions lora;
//   lora.rank = 8; lora.alpha = 16; lora.target_modules = {"q_proj", "v_proj"};
//   fabric::nn::apply_lora(*model, lora);       // before the optimizer: only adapters train
//   ... train (the optimizer over model->parameters(): frozen ones get no gradient) ...
//   fabric::nn::save_lora_adapter(*model, "out/adapter", lora, "meta-llama/Llama-3.2-1B");
//   fabric::nn::merge_lora(*model);             // or fold them into the base weights
//
// Each adapted layer y = W x + b becomes y = W x + b + B (A (dropout(x))) · alpha / rank, with
// A [rank, in] Kaiming-uniform (a = sqrt(5)) and B [out, rank] zeros (peft's default init: the
// model starts equal to the base). The adapter lives in the layer (fabric::nn::LinearImpl::
// set_lora) as the submodules lora_A and lora_B, so the parameter names are peft's without its
// "base_model.model." prefix and ".default" adapter name: "model.layers.0.self_attn.q_proj.
// lora_A.weight" (peft's file: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight").
// The base weights keep their names (a base checkpoint still loads by name).
//
// Target patterns: a pattern matches a layer when its '.'-separated components equal the last
// components of the layer's name, '*' matching any one component: "q_proj" matches
// "model.layers.0.self_attn.q_proj" (peft's suffix rule for a list of names), "layers.*.mlp.
// down_proj" every block's down_proj, "model.layers.0.self_attn.q_proj" that one layer. Only
// fabric::nn::Linear layers are candidates (torch::nn::Linear and the adapters' own are not).
// peft's single-string regular expressions are not supported.
//
// With strategies: ddp and fsdp take only parameters that require a gradient, so their buckets,
// all-reduces and optimizer state hold the adapters only; Fabric's checkpoints still save every
// parameter (the frozen base too). Under fsdp reading a unit's parameters gathers them (a
// collective): call lora_state on every rank (and save_lora_adapter from one rank with its
// tensors, or from all into one folder). Under tensor parallelism (fabric::nn::parallelize, the
// model_parallel strategy; before or after apply_lora) a split layer's adapter is split with it:
// A like the layer's input, B like its output (a column layer keeps A whole and its rows of B, a
// row layer its columns of A and B whole; fabric::nn::LinearImpl::set_lora), and trains as one
// process; lora_state gathers the cut tensors whole (a collective over tp: call it on every rank),
// load_lora_state takes whole tensors and keeps this rank's slices, merge_lora folds each rank's
// slice into its slice of the weight.
//
// With an empty init (Fabric::init_module, fabric.empty_init) apply_lora runs inside the make
// function, so the adapters are recorded with the base and setup() gives them the values a full
// construction gives (the same generator draws, on any strategy); the pretrained base then loads
// after setup, the adapters kept (Fabric::load_weights with is_lora_tensor):
//   auto model = f.init_module([&] {
//     fabric::models::Llama m(config);
//     fabric::nn::apply_lora(*m, lora);
//     return m;
//   });
//   f.setup(model, optimizer);
//   f.load_weights(model, weights.tensors, folder, fabric::nn::is_lora_tensor);  // base only
// apply_lora on a model built on the meta device outside such a recording is refused (its
// adapters would have no values to give).
//
// The frozen base in bf16 or float8 (store_lora_base, after the base weights are loaded): the
// weight of every adapted layer is kept as bfloat16, or as float8_e4m3fn with one float32 scale
// per output row (the buffer "weight_scale" [out] beside "weight": w ≈ float8 · scale, scale = the
// row's largest magnitude / 448), instead of the dtype the precision keeps parameters in. Only
// the adapted layers: every other tensor (embeddings, norms, the output head, Linear layers
// without an adapter) stays as it was, so exports of them are unchanged; adapt more layers to
// store more. The layer's forward dequantizes the weight to the compute dtype (autocast's, else
// the input's) inside the GEMM and again in backward (fabric/nn/frozen_weight.h), so no copy of
// it outlives the GEMM; the input's and the adapters' gradients flow as before. Per-row scales:
// a rank of a column-split layer holds its rows' scales, a row-split layer the whole scale (the
// row's largest magnitude over all ranks). merge_lora and merge_lora_state fold B A into the
// dequantized weight and write it in the adapters' dtype (the dtype the base had before it was
// stored), the scale dropped: the merged weight is W's stored rounding (bf16: 8 significant bits,
// relative error <= 2^-9; e4m3: 4 bits, <= 2^-4 of each element, less after the row scale) plus
// B A, not the folder's W plus B A. Adapter exports (lora_state, save_lora_adapter) are unchanged.
#ifndef FABRIC_NN_LORA_H_
#define FABRIC_NN_LORA_H_

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fabric::nn {

// How store_lora_base keeps the adapted layers' frozen weights (finetune.lora.base_dtype).
enum class LoraBaseDtype {
  kAuto,  // as the precision keeps parameters (nothing changes)
  kBf16,  // bfloat16
  kFp8,   // float8_e4m3fn, a float32 scale per output row
};

struct LoraOptions {
  int64_t rank = 8;    // r: 1 .. min(in, out) of every adapted layer
  double alpha = 16;   // lora_alpha: the adapter's output scaled by alpha / rank
  double dropout = 0;  // lora_dropout: on the adapter's input, in training mode only
  std::vector<std::string> target_modules;  // patterns (the file comment); at least one
  // adapter_config.json's fan_in_fan_out: the base model's layers are Hugging Face Conv1D
  // (GPT-2's c_attn, c_proj, c_fc: weights stored [in, out]). The adapters are the same tensors
  // either way (peft's lora_A [r, in], lora_B [out, r]); only the merge transposes B A there.
  bool fan_in_fan_out = false;
  // What store_lora_base does to the adapted layers' weights (apply_lora does not look at it).
  LoraBaseDtype base_dtype = LoraBaseDtype::kAuto;
};

// "auto", "bf16", "fp8" and back; parse throws fabric::Error naming the three for another text.
std::string to_string(LoraBaseDtype dtype);
LoraBaseDtype parse_lora_base_dtype(const std::string& text);

// Adds an adapter to every fabric::nn::Linear of `model` that a pattern matches, sets
// requires_grad false on every parameter of the model but the adapters, and returns the adapted
// layers' names in the model's order. fabric::Error (one line) for: no patterns; a pattern matching
// no Linear layer (naming the model's Linear names closest to it); rank < 1 or rank > min(in, out)
// of a matched layer (naming it and its sizes); alpha <= 0; dropout outside [0, 1); a layer that
// has an adapter already. A layer split by tensor parallelism gets its rank's slice of the
// adapter (drawn whole: the same values as one process's).
std::vector<std::string> apply_lora(torch::nn::Module& model, const LoraOptions& options);

// Stores the frozen weight of every adapted layer of `model` (apply_lora's) in `dtype` (the file
// comment): bf16 casts, fp8 quantizes per output row and registers the scale buffer
// "weight_scale". Call after the base weights are loaded, with the model whole or split by tensor
// parallelism (a row-split layer's scale is the whole row's: a collective over its tp group, every
// rank calls it); not on a model whose parameters a strategy has sharded (fsdp). kAuto, and a
// layer stored already in `dtype`, change nothing. Returns the layers stored. fabric::Error naming
// the layer for a weight that requires a gradient (a full fine-tune trains it), a weight on the
// meta device (load the base first), or one stored already in another dtype.
std::vector<std::string> store_lora_base(torch::nn::Module& model, LoraBaseDtype dtype);

// Whether `name` (a parameter's, by our names or peft's) is an adapter's: a component lora_A or
// lora_B ("model.layers.0.self_attn.q_proj.lora_A.weight").
bool is_lora_tensor(const std::string& name);

// Folds every adapter into its layer's weight (W += B · A · scaling, peft's merge) and removes
// the adapters: the model computes what it computed with them, as plain Linear layers. The
// base parameters keep the requires_grad apply_lora gave them (false). A stored base
// (store_lora_base) is dequantized first and the merged weight written in the adapters' dtype;
// a float8 one's "weight_scale" buffer stays, filled with ones (LibTorch cannot unregister a
// buffer; forward ignores it, the weight being no longer float8): leave it out of a state you
// save, as merge_lora_state does. Returns the layers merged.
std::vector<std::string> merge_lora(torch::nn::Module& model);

// The adapters' parameters under peft's names ("base_model.model." + our name): what
// adapter_model.safetensors holds. Views of the parameters (detached); a tensor that tensor
// parallelism cut is gathered whole (collective over its tp group: every rank calls it).
std::vector<std::pair<std::string, torch::Tensor>> lora_state(torch::nn::Module& model);

// Copies `state` (peft's names, as lora_state gives them, or ours without the prefix; peft's
// ".default" adapter name accepted) into the model's adapters: whole tensors (a layer split by
// tensor parallelism keeps this rank's slice). fabric::Error naming the tensor for a name the
// model has no adapter for, a shape that differs, or an adapter the state misses.
void load_lora_state(torch::nn::Module& model,
                     const std::vector<std::pair<std::string, torch::Tensor>>& state);

// Writes folder/adapter_model.safetensors (lora_state, as float32 or the parameters' dtype) and
// folder/adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout,
// target_modules, bias none, fan_in_fan_out, base_model_name_or_path), which
// peft.PeftModel.from_pretrained(base_model, folder) loads. Creates the folder; an existing one
// must be empty or an earlier export (fabric/checkpoint/output_check.h: the weights carry the
// export mark), so another adapter or model is never replaced. fabric::Error when the model has
// no adapter, the folder is another's, or a file cannot be written.
void save_lora_adapter(torch::nn::Module& model, const std::filesystem::path& folder,
                       const LoraOptions& options, const std::string& base_model_name_or_path = "");

// The same from the adapters' tensors under peft's names (lora_state's, or lora_state_of's), e.g.
// gathered from a sharded model on one rank.
void save_lora_adapter(const std::vector<std::pair<std::string, torch::Tensor>>& state,
                       const std::filesystem::path& folder, const LoraOptions& options,
                       const std::string& base_model_name_or_path = "");

// A whole model state by our names (Checkpointer's HfExport gets one): the adapters' entries
// ("….lora_A.weight", "….lora_B.weight") under peft's names, in order.
std::vector<std::pair<std::string, torch::Tensor>> lora_state_of(
    const std::vector<std::pair<std::string, torch::Tensor>>& whole);

// Folds the adapters of a whole model state into their base weights (W + B · A · alpha / rank,
// merge_lora's arithmetic in float32, the result in W's dtype) and drops the adapters' entries:
// the state of the merged model, by the base model's names. A stored base (a bf16 or float8 W
// with the adapters in another dtype, a float8 one with its "….weight_scale" entry) is
// dequantized, the result in the adapters' dtype, its scale entry dropped. fabric::Error naming the
// layer for an adapter whose base weight or partner is missing.
void merge_lora_state(std::vector<std::pair<std::string, torch::Tensor>>& whole,
                      const LoraOptions& options);

// The LoraOptions and the adapter weights of a peft folder (adapter_config.json,
// adapter_model.safetensors): apply_lora(model, read_lora_options(folder)) then
// load_lora_state(model, read_lora_state(folder)). fabric::Error "PATH: ..." for a missing file,
// a peft_type other than LORA, use_dora / use_rslora / a bias other than none,
// or a target_modules that is a regular expression.
LoraOptions read_lora_options(const std::filesystem::path& folder);
std::vector<std::pair<std::string, torch::Tensor>> read_lora_state(
    const std::filesystem::path& folder);

}  // namespace fabric::nn

#endif  // FABRIC_NN_LORA_H_
