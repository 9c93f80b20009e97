// bazel run //tools:prepare_text -- --input=PATH [--input=PATH ...] --output=DIR [--val_fraction=F]
//
// Turns text into token files in nanoGPT's format (fabric/data/tokens.h) for language models:
// DIR/train.bin and DIR/val.bin (uint16 ids), and DIR/meta.json ({"tokenizer": "bytes",
// "vocab_size": 256, "train_tokens": N, "val_tokens": M}). The tokenizer is byte-level: each byte
// of the input is one token (vocabulary 256; no download, any language, any file). An input that
// is a folder contributes every regular file under it, in path order; the files are joined as they
// are. The last --val_fraction of the tokens (default 0.1) become val.bin.
// Exit status: 0 written; 1 an input cannot be read or DIR cannot be written; 2 bad usage.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "fabric/core/atomic_file.h"
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

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw fabric::Error(file.string() + ": cannot read");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string as_bytes(const std::vector<uint16_t>& tokens, size_t begin, size_t end) {
  std::string out;
  out.reserve((end - begin) * 2);
  for (size_t i = begin; i < end; ++i) {
    out += static_cast<char>(tokens[i] & 0xff);
    out += static_cast<char>(tokens[i] >> 8);
  }
  return out;
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
    std::vector<fs::path> files;
    for (const fs::path& input : inputs) {
      std::error_code ec;
      if (fs::is_directory(input, ec)) {
        std::vector<fs::path> under;
        for (auto it = fs::recursive_directory_iterator(input, ec); !ec && it != fs::end(it);
             it.increment(ec))
          if (it->is_regular_file(ec)) under.push_back(it->path());
        std::sort(under.begin(), under.end());
        files.insert(files.end(), under.begin(), under.end());
      } else if (fs::is_regular_file(input, ec)) {
        files.push_back(input);
      } else {
        throw fabric::Error(input.string() + ": no such file or folder (--input)");
      }
    }
    std::vector<uint16_t> tokens;
    for (const fs::path& file : files) {
      const auto t = fabric::byte_tokens(read_all(file));
      tokens.insert(tokens.end(), t.begin(), t.end());
    }
    const auto val = static_cast<size_t>(static_cast<double>(tokens.size()) * val_fraction);
    const size_t train = tokens.size() - val;
    if (train < 2 || val < 2)
      throw fabric::Error(std::to_string(tokens.size()) + " bytes of text in " +
                          std::to_string(files.size()) +
                          " file(s) are too few for a train and a val split; give more text");
    std::error_code ec;
    fs::create_directories(output, ec);
    if (ec) throw fabric::Error(output.string() + ": cannot create (" + ec.message() + ")");
    fabric::write_file_atomically(output / "train.bin", as_bytes(tokens, 0, train));
    fabric::write_file_atomically(output / "val.bin", as_bytes(tokens, train, tokens.size()));
    fabric::write_file_atomically(
        output / "meta.json", "{\"tokenizer\": \"bytes\", \"vocab_size\": 256, \"train_tokens\": " +
                                  std::to_string(train) +
                                  ", \"val_tokens\": " + std::to_string(val) + "}\n");
    std::cout << "prepare_text: " << files.size() << " file(s), " << tokens.size()
              << " tokens (bytes) -> " << output.string() << "/train.bin (" << train
              << "), val.bin (" << val << ")" << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "prepare_text: " << fabric::describe(e) << std::endl;
    return 1;
  }
}
