// libFuzzer harness (issue 67): the token reader (fabric::TokenDataset) and what checks a folder of
// token files against its meta.json (fabric/data/tokens.h) must answer any bytes with data or
// a fabric::Error, never a crash, a hang, another exception or a sanitizer report. Properties
// checked (a violation aborts): an error is one non-empty line; an accepted meta.json has fields in
// their ranges; accepted splits hold the token counts meta.json gives, every window can be read
// and every id is below both vocabularies; a prompt's accepted ids are below them too.
// Input: meta.json's text (empty: no meta.json), a NUL, then three bytes (bit 0 of the first:
// uint32 ids, else uint16; the second: block_size 1-8; the third: the model's vocabulary, 0 for
// none, else 64 x it), then the token files' bytes (the first half train.bin, the rest val.bin;
// also the prompt's text).
//   bazel build --config=fuzz //tests/fuzz:tokens_fuzzer
//   bazel-bin/tests/fuzz/tokens_fuzzer -max_total_time=600 -rss_limit_mb=4096
//   tests/fuzz/corpus/tokens
#include <ATen/Parallel.h>
#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "fabric/core/error.h"
#include "fabric/data/tokens.h"

namespace fs = std::filesystem;

namespace {
void require(bool property, const char* what, const std::string& detail) {
  if (property) return;
  std::fprintf(stderr, "tokens_fuzzer: property violated: %s\n%s\n", what, detail.c_str());
  std::abort();
}

void check_error(const fabric::Error& e) {
  const std::string what = e.what();
  require(!what.empty() && what.find('\n') == std::string::npos, "one-line error", what);
}

void write(const fs::path& file, const std::string& bytes) {
  std::ofstream out(file, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  require(static_cast<bool>(out), "write", file.string());
}

// Every window of `d`: readable, its ids below `vocab` (> 0).
void read_all(const fabric::TokenDataset& d, int64_t vocab) {
  std::vector<int64_t> all(static_cast<size_t>(d.size()));
  for (int64_t i = 0; i < d.size(); ++i) all[static_cast<size_t>(i)] = i;
  const fabric::Batch b = d.get_batch(all);
  if (vocab > 0 && d.size() > 0) {
    require(b.data.max().item<int64_t>() < vocab, "ids below the vocabulary", "data");
    require(b.target.max().item<int64_t>() < vocab, "ids below the vocabulary", "target");
  }
}

// The folder the inputs are written to, removed at exit.
struct Scratch {
  fs::path dir;
  Scratch() {
    std::string name = (fs::temp_directory_path() / "tokens_fuzzer.XXXXXX").string();
    require(mkdtemp(name.data()) != nullptr, "mkdtemp", name);
    dir = name;
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Scratch scratch;
  static const bool once = [] {
    at::set_num_threads(1);
    return true;
  }();
  (void)once;
  const fs::path& dir = scratch.dir;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string meta_text = input.substr(0, nul);
  std::string rest = nul == std::string::npos ? "" : input.substr(nul + 1);
  const auto byte = [&](size_t i) { return i < rest.size() ? static_cast<uint8_t>(rest[i]) : 0; };
  fabric::TokenDataset::Options options;
  options.token_bytes = (byte(0) & 1) ? 4 : 2;
  options.block_size = 1 + byte(1) % 8;
  options.vocab_size = 64 * static_cast<int64_t>(byte(2));
  const int64_t model_vocab = options.vocab_size;
  rest = rest.size() > 3 ? rest.substr(3) : "";
  if (meta_text.empty()) {
    fs::remove(dir / "meta.json");  // a folder without one
  } else {
    write(dir / "meta.json", meta_text);
  }
  write(dir / "train.bin", rest.substr(0, rest.size() / 2));
  write(dir / "val.bin", rest.substr(rest.size() / 2));

  fabric::TokenMeta meta;
  try {
    meta = fabric::read_token_meta(dir);
  } catch (const fabric::Error& e) {
    check_error(e);
    return 0;
  }
  require(meta.vocab_size >= 0 && meta.vocab_size <= (int64_t{1} << 32), "vocab_size in range",
          meta_text);
  require(meta.train_tokens >= -1 && meta.val_tokens >= -1, "counts in range", meta_text);
  require(meta.tokenizer != "gpt2-bpe" || (!meta.vocab.empty() && !meta.merges.empty()),
          "gpt2-bpe names its files", meta_text);
  try {
    const auto splits = fabric::open_token_splits(dir, meta, options);
    int64_t vocab = model_vocab;
    if (meta.vocab_size > 0 && (vocab <= 0 || meta.vocab_size < vocab)) vocab = meta.vocab_size;
    for (const auto& [d, count] :
         {std::pair{splits.train, meta.train_tokens}, std::pair{splits.val, meta.val_tokens}}) {
      require(count < 0 || d->tokens() == count, "the count meta.json gives", meta_text);
      read_all(*d, vocab);
    }
  } catch (const fabric::Error& e) {
    check_error(e);
  }
  if (meta.tokenizer == "bytes") {
    try {
      const auto ids = fabric::encode_checked(meta, nullptr, rest, model_vocab, "gpt.prompt");
      require(ids.size() == rest.size(), "one id a byte", "");
      for (const int64_t id : ids)
        require((meta.vocab_size <= 0 || id < meta.vocab_size) &&
                    (model_vocab <= 0 || id < model_vocab),
                "prompt ids below the vocabularies", "");
    } catch (const fabric::Error& e) {
      check_error(e);
    }
  }
  return 0;
}
