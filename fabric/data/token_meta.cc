// The meta.json checks of fabric/data/tokens.h.
#include "fabric/data/tokens.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <system_error>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"

namespace fabric {

namespace fs = std::filesystem;

namespace {

const char kPrepareAgain[] = "or prepare the data again with tools/prepare_text";

// `v` as the message quotes it: its JSON text on one line, cut at 40 characters.
std::string quoted(const nlohmann::json& v) { return one_line(v.dump(), 40); }

// meta[field] as a whole number in [min, max], or `absent` when the field is not there; else
// fabric::Error "PATH: "FIELD" is ..., not ...; FIX".
int64_t whole_number(const nlohmann::json& meta, const char* field, int64_t min, int64_t max,
                     int64_t absent, const fs::path& path, const std::string& fix) {
  const auto it = meta.find(field);
  if (it == meta.end()) return absent;
  const nlohmann::json& v = *it;
  const std::string head = path.string() + ": \"" + field + "\" is ";
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    const auto number = nlohmann::json::parse(s, nullptr, false);
    if (number.is_number())
      throw Error(head + "the string " + quoted(v) +
                  ", not a number; write it without the quotes (" + one_line(s, 40) + ")");
    throw Error(head + "the string " + quoted(v) + ", not a whole number; " + fix);
  }
  if (!v.is_number()) throw Error(head + quoted(v) + ", not a whole number; " + fix);
  double value = 0;
  if (v.is_number_unsigned()) {
    value = static_cast<double>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    value = static_cast<double>(v.get<int64_t>());
  } else {
    value = v.get<double>();
    if (!std::isfinite(value) || std::floor(value) != value)
      throw Error(head + quoted(v) + ", not a whole number; " + fix);
  }
  if (value < static_cast<double>(min))
    throw Error(head + quoted(v) + ", below " + std::to_string(min) + "; " + fix);
  if (value > static_cast<double>(max))
    throw Error(head + quoted(v) + ", above " + std::to_string(max) + "; " + fix);
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(value);
}

// meta[field] as a string ("" when absent); else fabric::Error naming the field.
std::string string_field(const nlohmann::json& meta, const char* field, const fs::path& path,
                         const std::string& fix) {
  const auto it = meta.find(field);
  if (it == meta.end()) return "";
  if (!it->is_string())
    throw Error(path.string() + ": \"" + field + "\" is " + quoted(*it) + ", not a string; " + fix);
  return it->get<std::string>();
}

const char* dtype_of(int token_bytes) { return token_bytes == 4 ? "uint32" : "uint16"; }

// DIR/FILE's size against meta's count of its tokens (`field`; < 0: not given).
void check_count(const TokenMeta& meta, const fs::path& file, const char* field, int64_t count,
                 int token_bytes) {
  std::error_code ec;
  const auto size = fs::file_size(file, ec);
  if (count < 0 || ec) return;  // a file that cannot be sized: TokenDataset::open says why
  const auto bytes = static_cast<uint64_t>(size);
  const auto n = static_cast<uint64_t>(count);
  const uint64_t w = static_cast<uint64_t>(token_bytes), other = w == 2 ? 4 : 2;
  if (bytes % w == 0 && bytes / w == n) return;
  const std::string head = meta.path.string() + ": \"" + field + "\" is " + std::to_string(count);
  if (bytes % other == 0 && bytes / other == n)
    throw Error(head + ", the " + std::to_string(bytes) + " bytes of " + file.string() + " as " +
                dtype_of(static_cast<int>(other)) + " ids, but data.token_dtype reads " +
                dtype_of(token_bytes) +
                "; set data.token_dtype=" + dtype_of(static_cast<int>(other)));
  throw Error(head + ", but " + file.string() + " has " + std::to_string(bytes) + " bytes (" +
              std::to_string(bytes / w) + " " + dtype_of(token_bytes) + " ids); write its count (" +
              "bytes / " + std::to_string(w) + ") there, " + kPrepareAgain);
}

}  // namespace

TokenMeta parse_token_meta(const std::string& text, const fs::path& path) {
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path.string() + ": not JSON (" + one_line(e.what(), 200) +
                "); remove it or write it again with tools/prepare_text");
  }
  if (!meta.is_object())
    throw Error(path.string() +
                ": not a JSON object ({\"tokenizer\": ..., \"vocab_size\": ...}); " +
                "remove it or write it again with tools/prepare_text");
  TokenMeta m;
  m.path = path;
  m.tokenizer = string_field(
      meta, "tokenizer", path,
      std::string("write \"bytes\", \"gpt2-bpe\" or \"hf-tokenizer\", ") + kPrepareAgain);
  const std::string count_fix = std::string("write the file's token count (its size / 2 for ") +
                                "uint16 ids), " + kPrepareAgain;
  m.vocab_size = whole_number(meta, "vocab_size", 1, int64_t{1} << 32, 0, path,
                              std::string("write the tokenizer's vocabulary size (its largest id + "
                                          "1), ") +
                                  kPrepareAgain);
  m.train_tokens = whole_number(meta, "train_tokens", 0, int64_t{1} << 62, -1, path, count_fix);
  m.val_tokens = whole_number(meta, "val_tokens", 0, int64_t{1} << 62, -1, path, count_fix);
  const std::string file_fix = std::string("write the file's path, ") + kPrepareAgain;
  const std::string vocab = string_field(meta, "vocab", path, file_fix);
  const std::string merges = string_field(meta, "merges", path, file_fix);
  const std::string tokenizer_json = string_field(meta, "tokenizer_json", path, file_fix);
  if (m.tokenizer == "hf-tokenizer" && tokenizer_json.empty())
    throw Error(path.string() +
                ": \"tokenizer\": \"hf-tokenizer\" without \"tokenizer_json\" (the path of its "
                "tokenizer.json); add it, or prepare the data again with tools/prepare_text "
                "--tokenizer=tokenizer.json");
  if (m.tokenizer == "gpt2-bpe") {
    for (const auto& [field, value, file] :
         {std::tuple<const char*, const std::string&, const char*>{"vocab", vocab, "vocab.json"},
          {"merges", merges, "merges.txt"}})
      if (value.empty())
        throw Error(path.string() + ": \"tokenizer\": \"gpt2-bpe\" without \"" + field +
                    "\" (the path of the tokenizer's " + file + "); add it, or prepare the data " +
                    "again with tools/prepare_text --vocab=vocab.json --merges=merges.txt");
  }
  // Relative paths are meta.json's folder's (tools/prepare_text writes absolute ones).
  const fs::path folder = path.parent_path();
  if (!vocab.empty()) m.vocab = fs::path(vocab).is_absolute() ? fs::path(vocab) : folder / vocab;
  if (!merges.empty())
    m.merges = fs::path(merges).is_absolute() ? fs::path(merges) : folder / merges;
  if (!tokenizer_json.empty())
    m.tokenizer_json =
        fs::path(tokenizer_json).is_absolute() ? fs::path(tokenizer_json) : folder / tokenizer_json;
  return m;
}

TokenMeta read_token_meta(const fs::path& dir) {
  const fs::path path = dir / "meta.json";
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status)) return {};
  if (!fs::is_regular_file(status))
    throw Error(path.string() +
                ": not a regular file; remove it or write it again with "
                "tools/prepare_text");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot read");
  return parse_token_meta(std::string(std::istreambuf_iterator<char>(in), {}), path);
}

TokenSplits open_token_splits(const fs::path& dir, const TokenMeta& meta,
                              TokenDataset::Options options) {
  const fs::path train = dir / "train.bin", val = dir / "val.bin";
  std::error_code same_ec;
  if (fs::equivalent(train, val, same_ec) && !same_ec)
    throw Error(
        val.string() +
        ": is the same file as train.bin (a link to it): the validation "
        "loss would be measured on the training data; write val.bin with tools/prepare_text");
  check_count(meta, train, "train_tokens", meta.train_tokens, options.token_bytes);
  check_count(meta, val, "val_tokens", meta.val_tokens, options.token_bytes);
  // The tighter vocabulary: meta.json's (unpadded) unless the model's is smaller.
  if (meta.vocab_size > 0 && (options.vocab_size <= 0 || meta.vocab_size <= options.vocab_size)) {
    options.vocab_size = meta.vocab_size;
    options.vocab_name = "the \"vocab_size\" of " + meta.path.string() + ",";
    options.vocab_fix = std::string("write the tokenizer's vocabulary size there (its largest ") +
                        "id + 1), " + kPrepareAgain;
  }
  return {TokenDataset::open(train.string(), options), TokenDataset::open(val.string(), options)};
}

BpeTokenizer load_meta_tokenizer(const TokenMeta& meta) {
  const bool hf = meta.tokenizer == "hf-tokenizer";
  if (meta.tokenizer != "gpt2-bpe" && !hf)
    throw Error(meta.path.string() + ": \"tokenizer\" is \"" + one_line(meta.tokenizer, 40) +
                "\", not gpt2-bpe or hf-tokenizer");
  using Field = std::pair<const char*, const fs::path&>;
  for (const auto& [field, file] :
       hf ? std::vector<Field>{{"tokenizer_json", meta.tokenizer_json}}
          : std::vector<Field>{{"vocab", meta.vocab}, {"merges", meta.merges}}) {
    std::error_code ec;
    if (!fs::is_regular_file(file, ec))
      throw Error(meta.path.string() + ": \"" + field + "\" names " + file.string() + ", which " +
                  (fs::exists(file, ec) ? "is not a regular file" : "does not exist") +
                  "; restore it or correct the path");
  }
  BpeTokenizer bpe = hf ? BpeTokenizer::from_tokenizer_json(meta.tokenizer_json)
                        : BpeTokenizer::load(meta.vocab, meta.merges);
  if (meta.vocab_size > 0 && bpe.vocab_size() != meta.vocab_size)
    throw Error(meta.path.string() + ": \"vocab_size\" is " + std::to_string(meta.vocab_size) +
                ", but " + (hf ? meta.tokenizer_json : meta.vocab).string() + " holds ids up to " +
                std::to_string(bpe.vocab_size() - 1) + " (vocabulary size " +
                std::to_string(bpe.vocab_size()) + "); write " + std::to_string(bpe.vocab_size()) +
                " there, " + kPrepareAgain);
  return bpe;
}

std::vector<int64_t> encode_checked(const TokenMeta& meta, const BpeTokenizer* bpe,
                                    const std::string& text, int64_t model_vocab,
                                    const std::string& key) {
  const bool bytes = meta.tokenizer == "bytes";
  if (!bytes &&
      ((meta.tokenizer != "gpt2-bpe" && meta.tokenizer != "hf-tokenizer") || bpe == nullptr))
    throw Error(key + ": no tokenizer for \"" + one_line(meta.tokenizer, 40) + "\" (" +
                meta.path.string() + ")");
  std::vector<int64_t> ids;
  if (bytes) {
    for (const uint16_t t : byte_tokens(text)) ids.push_back(t);
  } else {
    ids = bpe->encode(text);
  }
  const bool meta_bound =
      meta.vocab_size > 0 && (model_vocab <= 0 || meta.vocab_size <= model_vocab);
  const int64_t bound = meta_bound ? meta.vocab_size : model_vocab;
  if (bound <= 0) return ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < bound) continue;
    const std::string what = bytes ? "byte " + std::to_string(i) : "token " + std::to_string(i);
    throw Error(key + ": " + what + " of '" + one_line(text, 40) + "' is id " +
                std::to_string(ids[i]) + ", not below " +
                (meta_bound
                     ? "the \"vocab_size\" " + std::to_string(bound) + " of " + meta.path.string() +
                           "; change " + key + " to text of the data's vocabulary"
                     : "model.vocab_size " + std::to_string(bound) + "; change " + key +
                           ", or raise model.vocab_size"));
  }
  return ids;
}

}  // namespace fabric
