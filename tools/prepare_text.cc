// bazel run //tools:prepare_text -- --input=PATH [--input=PATH ...] --output=DIR [--val_fraction=F]
//                                   [--vocab=vocab.json --merges=merges.txt |
//                                    --tokenizer=tokenizer.json]
//
// Turns text into token files in nanoGPT's format (fabric/data/tokens.h) for language models:
// DIR/train.bin and DIR/val.bin (uint16 ids), and DIR/meta.json ({"tokenizer": "bytes",
// "vocab_size": 256, "train_tokens": N, "val_tokens": M}). The tokenizer is byte-level: each byte
// of the input is one token (vocabulary 256; no download, any language, any file). With --vocab
// and --merges (GPT-2's vocab.json and merges.txt, or OpenAI's encoder.json and vocab.bpe) it is
// GPT-2's byte-level BPE (fabric/data/bpe.h): each file encoded on its own and followed by
// <|endoftext|>, meta.json {"tokenizer": "gpt2-bpe", "vocab_size": 50257, "vocab": ..., ...}.
// With --tokenizer (a Hugging Face tokenizer.json of GPT-2's, Llama 3's or Qwen2's kind) each file
// is followed by the tokenizer's eos, meta.json {"tokenizer": "hf-tokenizer", "tokenizer_json":
// ...}, and a vocabulary over 65,536 ids (Llama 3's, Qwen2's) writes uint32 ids. An
// input that is a folder contributes every regular file under it, in path order; with bytes the
// files are joined as they are. The last --val_fraction of the tokens (default 0.1) become val.bin.
// DIR is refused before anything is read when it is, or lies inside, an --input folder, when
// train.bin, val.bin or meta.json would replace an --input, --vocab, --merges or --tokenizer file,
// or when it
// is or lies inside a checkpoint (fabric/checkpoint/output_check.h).
// Exit status: 0 written; 1 an input cannot be read or DIR cannot be written; 2 bad usage
// (including a refused DIR).
#include <filesystem>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "fabric/checkpoint/output_check.h"
#include "fabric/core/error.h"
#include "fabric/core/files.h"
#include "fabric/core/paths.h"
#include "fabric/data/tokens.h"

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: prepare_text --input=PATH [--input=PATH ...] --output=DIR [--val_fraction=F] "
    "[--vocab=vocab.json --merges=merges.txt | --tokenizer=tokenizer.json]\n";

int usage(const std::string& why) {
  std::cerr << "prepare_text: " << why << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  fs::path output, vocab, merges, tokenizer;
  double val_fraction = 0.1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--input=", 0) == 0) {
      inputs.push_back(fabric::absolute_from_working_directory(arg.substr(8)));
    } else if (arg.rfind("--vocab=", 0) == 0) {
      vocab = fabric::absolute_from_working_directory(arg.substr(8));
    } else if (arg.rfind("--merges=", 0) == 0) {
      merges = fabric::absolute_from_working_directory(arg.substr(9));
    } else if (arg.rfind("--tokenizer=", 0) == 0) {
      tokenizer = fabric::absolute_from_working_directory(arg.substr(12));
    } else if (arg.rfind("--output=", 0) == 0) {
      output = fabric::absolute_from_working_directory(arg.substr(9));
    } else if (arg.rfind("--val_fraction=", 0) == 0) {
      try {
        size_t used = 0;
        val_fraction = std::stod(arg.substr(15), &used);
        if (used != arg.size() - 15) throw std::invalid_argument("trailing characters");
      } catch (const std::exception&) {
        return usage("--val_fraction: '" + arg.substr(15) + "' is not a number");
      }
      if (!(val_fraction > 0 && val_fraction < 1))
        return usage("--val_fraction: " + arg.substr(15) + " is not between 0 and 1");
    } else if (arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else {
      return usage("unknown argument '" + arg + "'");
    }
  }
  if (inputs.empty()) return usage("give at least one --input");
  if (output.empty()) return usage("give --output=DIR");
  if (vocab.empty() != merges.empty())
    return usage("--vocab and --merges go together (GPT-2's vocab.json and merges.txt)");
  if (!tokenizer.empty() && !vocab.empty())
    return usage("give --tokenizer=tokenizer.json or --vocab and --merges, not both");
  try {
    // Inputs that are not files or folders (a FIFO would block, /dev/zero never end).
    for (const fs::path& in : inputs)
      if (fs::exists(in) && !fs::is_directory(in)) fabric::require_regular_file(in);
    if (!vocab.empty()) fabric::require_regular_file(vocab);
    if (!merges.empty()) fabric::require_regular_file(merges);
    if (!tokenizer.empty()) fabric::require_regular_file(tokenizer);
    // Never over an input: --output inside an --input folder would be read back as text by the
    // next run (validation tokens leaking into training); train.bin over an --input destroys it.
    std::vector<fabric::InputPath> read;
    for (const fs::path& in : inputs) read.push_back({in, "--input"});
    read.push_back({vocab, "--vocab"});
    read.push_back({merges, "--merges"});
    read.push_back({tokenizer, "--tokenizer"});
    fabric::check_output(output, "--output", read, /*folder=*/true,
                         {"train.bin", "val.bin", "meta.json"});
  } catch (const std::exception& e) {
    return usage(fabric::describe(e));
  }
  try {
    const fabric::PreparedText done =
        !tokenizer.empty() ? fabric::prepare_hf_text(inputs, output, tokenizer, val_fraction)
        : vocab.empty()    ? fabric::prepare_byte_text(inputs, output, val_fraction)
                           : fabric::prepare_bpe_text(inputs, output, vocab, merges, val_fraction);
    std::cout << "prepare_text: " << done.files << " file(s), "
              << done.train_tokens + done.val_tokens << " tokens ("
              << (!tokenizer.empty() ? tokenizer.filename().string()
                  : vocab.empty()    ? "bytes"
                                     : "GPT-2 BPE")
              << ") -> " << output.string() << "/train.bin (" << done.train_tokens << "), val.bin ("
              << done.val_tokens << ")" << std::endl;
    if (done.no_separator && done.files > 1)
      std::cerr << "warning: --tokenizer: no end-of-text id found (an eos_token in "
                   "tokenizer_config.json or an eos_token_id in generation_config.json beside it, "
                   "or a <|endoftext|> token): the "
                << done.files << " files' tokens are joined without a separator" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "prepare_text: " << fabric::describe(e) << std::endl;
    return 1;
  }
}
