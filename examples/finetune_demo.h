// The offline start of //examples:finetune: without model.pretrained it fine-tunes a tiny Llama
// that it builds and saves itself, on instruction data it makes from this machine's Python
// standard library, and says so. Nothing is downloaded.
//
// The model folder (a Hugging Face layout that transformers and peft load): config.json and
// model.safetensors of a random Llama (2 layers, width 64, 4 heads, 2 key/value heads, tied
// output; seed 0), and a byte-level tokenizer.json with no merges (the 256 bytes, then
// <|endoftext|> as eos, <|im_start|> and <|im_end|> for the chatml template; the embedding has
// 264 rows, a multiple of 8 for tensor parallelism, the last 5 unused), and tokenizer_config.json
// with a ChatML chat template (data.template chat_template renders as chatml). The data: one
// example per documented public function, {"prompt": "What does NAME(ARGS) in Python's MODULE
// do?", "response": the first line of its docstring}, every tenth one to val.jsonl.
#ifndef EXAMPLES_FINETUNE_DEMO_H_
#define EXAMPLES_FINETUNE_DEMO_H_

#include <filesystem>

#include "fabric/fabric.h"

namespace examples::finetune {

struct Demo {
  std::filesystem::path model;       // the model folder
  std::filesystem::path train, val;  // JSONL files
  int64_t train_examples = 0, val_examples = 0;
};

// Writes (local rank 0; once: reused when the files exist, rebuilt when an older version of the
// demo wrote them; the run's random generator left as it was) and returns the demo under `cache`
// (finetune.demo_cache, default ~/.cache/fabricpp). fabric::ConfigError when no Python standard
// library is found (python3 not on PATH): then give model.pretrained and data.train.
Demo prepare_demo(fabric::Fabric& f, const std::filesystem::path& cache);

}  // namespace examples::finetune

#endif  // EXAMPLES_FINETUNE_DEMO_H_
