// The parts of //examples:finetune around its training loop: its config keys, the LoRA options
// they give, the sample prompt's ids, the trainable-only module a LoRA optimizer holds.
#ifndef EXAMPLES_FINETUNE_RECIPE_H_
#define EXAMPLES_FINETUNE_RECIPE_H_

#include <torch/nn/module.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <vector>

#include "fabric/config/config.h"
#include "fabric/config/schema.h"
#include "fabric/data/bpe.h"
#include "fabric/data/instruct.h"
#include "fabric/fabric.h"
#include "fabric/hf/pretrained.h"
#include "fabric/nn/lora.h"

namespace examples::finetune {

// training_schema() plus model.*, data.* (train, val, template, packed, block_size, token_cache,
// add_bos) and finetune.* (docs/finetune.md lists them with their defaults); checkpoint.export_*
// default to {run_dir}/export as a Hugging Face folder or adapter.
fabric::ConfigSchema schema();

// finetune.demo_cache, or the examples' cache folder (examples::gpt::cache_home).
std::filesystem::path demo_cache(const fabric::Config& c);

// The trainable parameters of a model under their own names ('.'-separated, in a tree of
// submodules holding only them; the same tensors): a LoRA run's optimizer's module under every
// strategy (fsdp and model_parallel take only parameters that train), optimizer.no_weight_decay
// and optimizer.lr_scale still matching the model's names.
std::shared_ptr<torch::nn::Module> trainable_tree(torch::nn::Module& model);

// What a run reads before its model: the folder (model.pretrained, else the demo's, written
// first), its config (a Llama-family or GPT-2 model; ConfigErrors at model.pretrained,
// data.train, data.template, data.block_size, model.activation_checkpointing), the tokenizer,
// and the instruction data tokenized under data.* (each node's local rank 0 first, through
// data.token_cache; the others read its cache). Prints what it read. Collective (a barrier).
struct Inputs {
  std::filesystem::path folder;
  fabric::hf::Pretrained pretrained;
  fabric::InstructDataset::Options options;
  std::shared_ptr<const fabric::BpeTokenizer> tokenizer;
  std::shared_ptr<fabric::InstructDataset> train, val;  // val: null without data.val
};
Inputs open_inputs(fabric::Fabric& f);

// finetune.lora.* as fabric::nn::LoraOptions.
fabric::nn::LoraOptions lora_options(const fabric::Config& c);

// finetune.sample_prompt as data.template renders a prompt (a chat template: one user message and
// the generation prompt), the bos id first under data.add_bos: what the model answers at the end.
std::vector<int64_t> sample_ids(const fabric::Config& c, const Inputs& in);

}  // namespace examples::finetune

#endif  // EXAMPLES_FINETUNE_RECIPE_H_
