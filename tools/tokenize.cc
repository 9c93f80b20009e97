// bazel run //tools:tokenize -- --tokenizer=PATH/tokenizer.json [--decode]
//
// Text to token ids and back with a Hugging Face tokenizer.json (fabric/data/bpe.h: byte-level
// BPE as GPT-2, Llama 3 and Qwen2 ship it). Encoding reads UTF-8 text on stdin and prints its ids
// on one line, separated by spaces (no bos/eos added; special tokens written in the text are
// their ids); --decode reads ids (separated by any whitespace) on stdin and writes their text as
// `tokenizers`' decode does (ids past the vocabulary skipped, ill-formed UTF-8 as U+FFFD).
// Exit status: 0 done; 1 the tokenizer or the input is refused (one line on stderr); 2 bad usage.
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/core/paths.h"
#include "fabric/data/bpe.h"

namespace {

constexpr const char* kUsage =
    "usage: tokenize --tokenizer=PATH/tokenizer.json [--decode] < input\n";

int usage(const std::string& why) {
  std::cerr << "tokenize: " << why << "\n" << kUsage;
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer;
  bool decode = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--tokenizer=", 0) == 0) {
      if (arg.size() == 12) return usage("--tokenizer: no path given; give PATH/tokenizer.json");
      tokenizer = fabric::absolute_from_working_directory(arg.substr(12)).string();
    } else if (arg == "--decode") {
      decode = true;
    } else if (arg == "--help") {
      std::cout << kUsage;
      return 0;
    } else {
      return usage("unknown argument '" + arg + "'");
    }
  }
  if (tokenizer.empty()) return usage("give --tokenizer=PATH/tokenizer.json");
  try {
    const auto bpe = fabric::BpeTokenizer::from_tokenizer_json(tokenizer);
    const std::string input{std::istreambuf_iterator<char>(std::cin), {}};
    if (decode) {
      std::vector<int64_t> ids;
      std::istringstream in(input);
      for (std::string word; in >> word;) {
        size_t used = 0;
        int64_t id = -1;
        try {
          id = std::stoll(word, &used);
        } catch (const std::exception&) {
        }
        if (used != word.size() || id < 0)
          throw fabric::Error("stdin: '" + fabric::one_line(word, 40) +
                              "' is not a token id; give ids separated by spaces");
        ids.push_back(id);
      }
      std::cout << bpe.decode_text(ids) << std::flush;
    } else {
      if (const size_t at = fabric::first_invalid_utf8(input); at != std::string::npos)
        throw fabric::Error("stdin: byte " + std::to_string(at) +
                            " is not UTF-8; give UTF-8 text (or decode it first)");
      const std::vector<int64_t> ids = bpe.encode(input);
      std::string line;
      for (size_t k = 0; k < ids.size(); ++k) line += (k ? " " : "") + std::to_string(ids[k]);
      std::cout << line << "\n" << std::flush;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tokenize: " << fabric::describe(e) << std::endl;
    return 1;
  }
}
