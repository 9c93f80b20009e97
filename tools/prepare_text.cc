// bazel run //tools:prepare_text -- --input=PATH [--input=PATH ...] --output=DIR [--val_fraction=F]
//
// Turns text into token files in nanoGPT's format (fabric/data/tokens.h) for language models:
// DIR/train.bin and DIR/val.bin (uint16 ids), and DIR/meta.json ({"tokenizer": "bytes",
// "vocab_size": 256, "train_tokens": N, "val_tokens": M}). The tokenizer is byte-level: each byte
// of the input is one token (vocabulary 256; no download, any language, any file). An input that
// is a folder contributes every regular file under it, in path order; the files are joined as they
// are. The last --val_fraction of the tokens (default 0.1) become val.bin.
// Exit status: 0 written; 1 an input cannot be read or DIR cannot be written; 2 bad usage.
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/data/tokens.h"

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: prepare_text --input=PATH [--input=PATH ...] --output=DIR [--val_fraction=F]\n";

int usage(const std::string& why) {
  std::cerr << "prepare_text: " << why << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  fs::path output;
  double val_fraction = 0.1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--input=", 0) == 0) {
      inputs.push_back(fabric::absolute_from_working_directory(arg.substr(8)));
    } else if (arg.rfind("--output=", 0) == 0) {
      output = fabric::absolute_from_working_directory(arg.substr(9));
    } else if (arg.rfind("--val_fraction=", 0) == 0) {
      try {
        val_fraction = std::stod(arg.substr(15));
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
  try {
    const fabric::PreparedText done = fabric::prepare_byte_text(inputs, output, val_fraction);
    std::cout << "prepare_text: " << done.files << " file(s), "
              << done.train_tokens + done.val_tokens << " tokens (bytes) -> " << output.string()
              << "/train.bin (" << done.train_tokens << "), val.bin (" << done.val_tokens << ")"
              << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "prepare_text: " << fabric::describe(e) << std::endl;
    return 1;
  }
}
