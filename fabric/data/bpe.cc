#include "fabric/data/bpe.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <limits>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "fabric/core/error.h"

namespace fabric {
namespace {

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path.string() + ": cannot read (" + what + ")");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes for
// the code points 256, 257, ... in byte order.
std::vector<std::string> byte_symbols() {
  std::vector<std::string> s(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    append_utf8(s[b], printable ? b : next++);
  }
  return s;
}

// One character of `text` at `i`: its code point and length (an invalid byte is a character of
// its own, U+FFFD).
std::pair<uint32_t, size_t> char_at(const std::string& text, size_t i) {
  const auto c = static_cast<unsigned char>(text[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > text.size()) return {0xFFFD, 1};
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(text[i + k]);
    if ((d >> 6) != 0x2) return {0xFFFD, 1};
    cp = (cp << 6) | (d & 0x3F);
  }
  return {cp, n};
}

enum class Class { kLetter, kNumber, kSpace, kOther };

struct CodePointRange {
  uint32_t first, last;
};
#include "fabric/data/unicode_classes.inc"

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], uint32_t cp) {
  const auto* it =
      std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                       [](uint32_t v, const CodePointRange& r) { return v < r.first; });
  return it != std::begin(ranges) && cp <= std::prev(it)->last;
}

Class class_of(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Class::kLetter;
    if (cp >= '0' && cp <= '9') return Class::kNumber;
    if (cp == ' ' || (cp >= '\t' && cp <= '\r')) return Class::kSpace;
    return Class::kOther;
  }
  // Unicode's White_Space characters above ASCII.
  if (cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
      cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000)
    return Class::kSpace;
  // \p{L} and \p{N}: Unicode's general categories (tools/gen_unicode_classes.py).
  if (in_ranges(kLetterRanges, cp)) return Class::kLetter;
  if (in_ranges(kNumberRanges, cp)) return Class::kNumber;
  return Class::kOther;
}

bool is_space(uint32_t cp) { return class_of(cp) == Class::kSpace; }

// Canonical composition (NFC): tools/gen_unicode_nfc.py's tables, Hangul by arithmetic.
struct CombiningRange {
  uint32_t first, last, ccc;
};
struct Decomposition {
  uint32_t cp, first, second;
};
struct Composition {
  uint32_t first, second, composite;
};
#include "fabric/data/unicode_nfc.inc"

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = 11172;

uint32_t combining_class(uint32_t cp) {
  const auto* it =
      std::upper_bound(std::begin(kCombiningRanges), std::end(kCombiningRanges), cp,
                       [](uint32_t v, const CombiningRange& r) { return v < r.first; });
  return it != std::begin(kCombiningRanges) && cp <= std::prev(it)->last ? std::prev(it)->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / (kVCount * kTCount));
    out.push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* it = std::lower_bound(std::begin(kDecompositions), std::end(kDecompositions), cp,
                                    [](const Decomposition& d, uint32_t v) { return d.cp < v; });
  if (it == std::end(kDecompositions) || it->cp != cp) {
    out.push_back(cp);
    return;
  }
  decompose(it->first, out);
  if (it->second != 0) decompose(it->second, out);
}

// The primary composite of `a` and `b`, or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto* it =
      std::lower_bound(std::begin(kCompositions), std::end(kCompositions), std::make_pair(a, b),
                       [](const Composition& c, const std::pair<uint32_t, uint32_t>& v) {
                         return std::make_pair(c.first, c.second) < v;
                       });
  return it != std::end(kCompositions) && it->first == a && it->second == b ? it->composite : 0;
}

// Llama 3's and Qwen2's pattern, alternative by alternative as a backtracking regex engine takes
// them: (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,max_digits} |
// ' '?[^\s\p{L}\p{N}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+.
template <typename Char>
std::vector<std::string> split_llama(const std::string& text, const std::vector<Char>& chars,
                                     size_t max_digits) {
  std::vector<std::string> pieces;
  const size_t n = chars.size();
  auto piece = [&](size_t from, size_t to) {
    const size_t end = to < n ? chars[to].at : text.size();
    pieces.push_back(text.substr(chars[from].at, end - chars[from].at));
  };
  auto newline = [&](size_t k) { return chars[k].cp == '\r' || chars[k].cp == '\n'; };
  auto lower = [&](size_t k) -> uint32_t {
    if (k >= n) return 0;
    const uint32_t c = chars[k].cp;
    if (c >= 'A' && c <= 'Z') return c + 32;
    return c == 0x17F ? 's' : c;  // long s folds to s
  };
  size_t i = 0;
  while (i < n) {
    if (chars[i].cp == '\'') {
      const uint32_t a = lower(i + 1), b = lower(i + 2);
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len > 0) {
        piece(i, i + len);
        i += len;
        continue;
      }
    }
    size_t j = i;
    if (chars[i].cls != Class::kLetter && chars[i].cls != Class::kNumber && !newline(i) &&
        i + 1 < n && chars[i + 1].cls == Class::kLetter)
      j = i + 1;
    if (chars[j].cls == Class::kLetter) {
      while (j < n && chars[j].cls == Class::kLetter) ++j;
      piece(i, j);
      i = j;
      continue;
    }
    if (chars[i].cls == Class::kNumber) {
      j = i;
      while (j < n && j - i < max_digits && chars[j].cls == Class::kNumber) ++j;
      piece(i, j);
      i = j;
      continue;
    }
    j = chars[i].cp == ' ' && i + 1 < n && chars[i + 1].cls == Class::kOther ? i + 1 : i;
    if (chars[j].cls == Class::kOther) {
      while (j < n && chars[j].cls == Class::kOther) ++j;
      while (j < n && newline(j)) ++j;
      piece(i, j);
      i = j;
      continue;
    }
    // Whitespace from i to k: through its last newline; else the run less the character before
    // a non-space (a lone one stays alone).
    size_t k = i, last_newline = n;
    for (; k < n && chars[k].cls == Class::kSpace; ++k)
      if (newline(k)) last_newline = k;
    const size_t end = last_newline < n ? last_newline + 1 : k == n || k - i == 1 ? k : k - 1;
    piece(i, end);
    i = end;
  }
  return pieces;
}

}  // namespace

std::string BpeTokenizer::nfc(const std::string& text) {
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return text;  // nothing below U+0300 decomposes differently or combines
  std::vector<uint32_t> d;
  for (size_t i = 0; i < text.size();) {
    const auto [cp, len] = char_at(text, i);
    decompose(cp, d);
    i += len;
  }
  // Canonical order: each run of non-starters sorted (stably) by combining class.
  for (size_t i = 0; i < d.size();) {
    if (combining_class(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && combining_class(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [](uint32_t a, uint32_t b) {
      return combining_class(a) < combining_class(b);
    });
    i = j;
  }
  std::vector<uint32_t> out;
  size_t starter = std::string::npos;
  for (const uint32_t c : d) {
    const uint32_t cc = combining_class(c);
    if (starter != std::string::npos) {
      const uint32_t last = combining_class(out.back());
      if (out.size() - 1 == starter || (last != 0 && last < cc)) {
        if (const uint32_t composite = compose(out[starter], c); composite != 0) {
          out[starter] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = out.size();
    out.push_back(c);
  }
  std::string s;
  for (const uint32_t c : out) append_utf8(s, c);
  return s;
}

std::vector<std::string> BpeTokenizer::pretokenize(const std::string& text, Pattern pattern) {
  // The characters of the text with their classes.
  struct Char {
    size_t at, len;
    uint32_t cp;
    Class cls;
  };
  std::vector<Char> chars;
  for (size_t i = 0; i < text.size();) {
    const auto [cp, len] = char_at(text, i);
    chars.push_back({i, len, cp, class_of(cp)});
    i += len;
  }
  if (pattern != Pattern::kGpt2)
    return split_llama(text, chars, pattern == Pattern::kLlama3 ? 3 : 1);
  std::vector<std::string> pieces;
  const size_t n = chars.size();
  auto piece = [&](size_t from, size_t to) {  // characters [from, to)
    const size_t end = to < n ? chars[to].at : text.size();
    pieces.push_back(text.substr(chars[from].at, end - chars[from].at));
  };
  size_t i = 0;
  while (i < n) {
    // 's 't 're 've 'm 'll 'd
    if (chars[i].cp == '\'' && i + 1 < n) {
      const uint32_t a = chars[i + 1].cp, b = i + 2 < n ? chars[i + 2].cp : 0;
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len > 0) {
        piece(i, i + len);
        i += len;
        continue;
      }
    }
    // An optional space, then a run of letters, of numbers, or of other symbols.
    const size_t start = i;
    size_t j = chars[i].cp == ' ' && i + 1 < n && chars[i + 1].cls != Class::kSpace ? i + 1 : i;
    if (chars[j].cls != Class::kSpace) {
      const Class cls = chars[j].cls;
      while (j < n && chars[j].cls == cls) ++j;
      piece(start, j);
      i = j;
      continue;
    }
    // Whitespace: the run, less its last character when a non-space follows it (that one goes
    // with the next piece); a single whitespace character before a non-space stays alone.
    size_t k = i;
    while (k < n && chars[k].cls == Class::kSpace) ++k;
    const size_t end = k < n && k - i > 1 ? k - 1 : k;
    piece(i, end);
    i = end;
  }
  return pieces;
}

struct BpeTokenizer::Loader {
  static void set_vocab(BpeTokenizer& t, const nlohmann::json& vocab, const std::string& file) {
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
        throw Error(file + ": \"" + it.key() + "\" has no non-negative integer id");
      const int64_t id = it.value().get<int64_t>();
      // Two symbols with one id: decoding could not tell them apart, and training data written
      // with one would decode as the other.
      if (const auto other = t.symbols_.find(id); other != t.symbols_.end())
        throw Error(file + ": \"" + one_line(other->second, 40) + "\" and \"" +
                    one_line(it.key(), 40) + "\" share id " + std::to_string(id) +
                    "; each symbol needs its own id (a damaged or hand-edited vocabulary?)");
      t.vocab_[it.key()] = id;
      t.symbols_[id] = it.key();
      t.vocab_size_ = std::max(t.vocab_size_, id + 1);
    }
    for (int b = 0; b < 256; ++b)
      if (!t.vocab_.count(t.byte_symbol_[b]))
        throw Error(file + ": no symbol for byte " + std::to_string(b) +
                    "; is it a byte-level BPE vocabulary (GPT-2's vocab.json / encoder.json)?");
  }

  static void add_merge(BpeTokenizer& t, std::string a, std::string b, const std::string& where,
                        const std::string& vocab_file, int& rank) {
    if (!t.vocab_.count(a + b))
      throw Error(where + ": the merge of '" + a + "' and '" + b + "' is not in " + vocab_file +
                  " (files of two different tokenizers?)");
    t.ranks_.emplace(std::make_pair(std::move(a), std::move(b)), rank++);
  }
};

BpeTokenizer BpeTokenizer::load(const std::filesystem::path& vocab_json,
                                const std::filesystem::path& merges_txt) {
  BpeTokenizer t;
  t.byte_symbol_ = byte_symbols();
  for (int b = 0; b < 256; ++b) t.symbol_byte_[t.byte_symbol_[b]] = static_cast<unsigned char>(b);
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(read_file(vocab_json, "the BPE vocabulary"));
  } catch (const nlohmann::json::exception& e) {
    throw Error(vocab_json.string() + ": not a JSON vocabulary (" + e.what() + ")");
  }
  if (!vocab.is_object())
    throw Error(vocab_json.string() + ": expected an object {\"symbol\": id, ...}");
  Loader::set_vocab(t, vocab, vocab_json.string());
  if (auto e = t.vocab_.find("<|endoftext|>"); e != t.vocab_.end()) t.eot_ = e->second;

  std::istringstream merges(read_file(merges_txt, "the BPE merges"));
  std::string line;
  int line_number = 0, rank = 0;
  while (std::getline(merges, line)) {
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw Error(merges_txt.string() + ":" + std::to_string(line_number) +
                  ": expected two symbols separated by one space, got '" + line + "'");
    Loader::add_merge(t, line.substr(0, space), line.substr(space + 1),
                      merges_txt.string() + ":" + std::to_string(line_number), vocab_json.string(),
                      rank);
  }
  t.cache_ = std::make_shared<std::unordered_map<std::string, std::vector<int64_t>>>();
  return t;
}

namespace {

using nlohmann::json;

// The JSON of a file beside tokenizer.json, or null when there is none.
json sibling_json(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  try {
    return json::parse(read_file(path, "a tokenizer's configuration"));
  } catch (const json::exception& e) {
    throw Error(path.string() + ": not JSON (" + one_line(e.what(), 80) +
                "); fix or remove the file");
  }
}

// A token's text in tokenizer_config.json: "text", {"content": "text"}, or null.
std::string token_text(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

// An id in generation_config.json: a number, or the first of a list.
int64_t config_id(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return -1;
  const json& v = config[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  return -1;
}

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>()
                                                                      : "";
}

bool flag(const json& j, const char* key, bool otherwise) {
  return j.is_object() && j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : otherwise;
}

}  // namespace

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::filesystem::path& tokenizer_json) {
  const std::string file = tokenizer_json.string();
  json j;
  try {
    j = json::parse(read_file(tokenizer_json, "a Hugging Face tokenizer.json"));
  } catch (const json::exception& e) {
    throw Error(file + ": not JSON (" + one_line(e.what(), 80) +
                "); give a Hugging Face tokenizer.json");
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw Error(file + ": no \"model\" object; give a Hugging Face tokenizer.json");
  const json& model = j["model"];
  std::string type = type_of(model);
  if (type.empty() && model.contains("merges")) type = "BPE";
  const std::string only =
      "; only byte-level BPE tokenizers (GPT-2's, Llama 3's, Qwen2's kind) are";
  if (type == "Unigram")
    throw Error(file +
                ": a Unigram model (SentencePiece's kind: T5, ALBERT, XLNet) is not supported" +
                only);
  if (type == "WordPiece")
    throw Error(file + ": a WordPiece model (BERT's kind) is not supported" + only);
  if (type != "BPE")
    throw Error(file + ": model type \"" + one_line(type, 40) + "\" is not supported" + only);
  if (flag(model, "byte_fallback", false))
    throw Error(file +
                ": a BPE with byte_fallback (SentencePiece's kind: Llama 2, Mistral) is "
                "not supported" +
                only);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
      throw Error(file + ": model." + key + " \"" + model[key].get<std::string>() +
                  "\" is not supported" + only);
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0)
    throw Error(file + ": model.dropout is set; set it to null (dropout is for training only)");
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    throw Error(file + ": model has no \"vocab\" object or no \"merges\" list");

  BpeTokenizer t;
  t.byte_symbol_ = byte_symbols();
  for (int b = 0; b < 256; ++b) t.symbol_byte_[t.byte_symbol_[b]] = static_cast<unsigned char>(b);
  Loader::set_vocab(t, model["vocab"], file);
  int rank = 0;
  const json& merges = model["merges"];
  for (size_t k = 0; k < merges.size(); ++k) {
    const json& m = merges[k];
    const std::string where = file + ": model.merges[" + std::to_string(k) + "]";
    std::string a, b;
    if (m.is_string()) {  // "a b"
      const std::string line = m.get<std::string>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos)
        throw Error(where + ": expected two symbols separated by one space, got '" +
                    one_line(line, 40) + "'");
      a = line.substr(0, space);
      b = line.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw Error(where + ": expected \"a b\" or [\"a\", \"b\"], got " + one_line(m.dump(), 40));
    }
    Loader::add_merge(t, std::move(a), std::move(b), where, "model.vocab", rank);
  }
  t.ignore_merges_ = flag(model, "ignore_merges", false);

  // Normalizer: none or NFC (alone or in a Sequence).
  const json normalizer = j.value("normalizer", json(nullptr));
  std::vector<json> normalizers;
  if (type_of(normalizer) == "Sequence" && normalizer.contains("normalizers") &&
      normalizer["normalizers"].is_array()) {
    for (const json& n : normalizer["normalizers"]) normalizers.push_back(n);
  } else if (!normalizer.is_null()) {
    normalizers.push_back(normalizer);
  }
  for (const json& n : normalizers) {
    if (type_of(n) != "NFC")
      throw Error(file + ": normalizer \"" +
                  one_line(type_of(n).empty() ? n.dump() : type_of(n), 40) +
                  "\" is not supported; only none and NFC are");
    t.nfc_ = true;
  }

  // Pre-tokenizer: ByteLevel with GPT-2's pattern, or Split(pattern) then ByteLevel.
  const json pre = j.value("pre_tokenizer", json(nullptr));
  const std::string pre_error =
      file + ": pre_tokenizer " + one_line(pre.dump(), 60) +
      " is not supported; a byte-level BPE needs ByteLevel (GPT-2) or Sequence [Split, ByteLevel] "
      "(Llama 3, Qwen2)";
  if (type_of(pre) == "ByteLevel" && flag(pre, "use_regex", true)) {
    t.pattern_ = Pattern::kGpt2;
    t.add_prefix_space_ = flag(pre, "add_prefix_space", false);
  } else if (type_of(pre) == "Sequence" && pre.contains("pretokenizers") &&
             pre["pretokenizers"].is_array() && pre["pretokenizers"].size() == 2 &&
             type_of(pre["pretokenizers"][0]) == "Split" &&
             type_of(pre["pretokenizers"][1]) == "ByteLevel" &&
             !flag(pre["pretokenizers"][1], "use_regex", true)) {
    const json& split = pre["pretokenizers"][0];
    const json pattern = split.value("pattern", json(nullptr));
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string() ||
        split.value("behavior", std::string()) != "Isolated" || flag(split, "invert", false))
      throw Error(pre_error);
    const std::string regex = pattern["Regex"].get<std::string>();
    if (regex == kGpt2Regex) {
      t.pattern_ = Pattern::kGpt2;
    } else if (regex == kLlama3Regex) {
      t.pattern_ = Pattern::kLlama3;
    } else if (regex == kQwen2Regex) {
      t.pattern_ = Pattern::kQwen2;
    } else {
      throw Error(file + ": pre-tokenizer pattern '" + one_line(regex, 60) +
                  "' is not supported; only GPT-2's, Llama 3's and Qwen2's are");
    }
    t.add_prefix_space_ = flag(pre["pretokenizers"][1], "add_prefix_space", false);
    t.prefix_pieces_ = true;
  } else {
    throw Error(pre_error);
  }
  const json decoder = j.value("decoder", json(nullptr));
  if (!decoder.is_null() && type_of(decoder) != "ByteLevel")
    throw Error(file + ": decoder \"" + one_line(type_of(decoder), 40) +
                "\" is not supported; a byte-level BPE decodes with ByteLevel");

  // Added and special tokens.
  t.added_by_byte_.resize(256);
  const json added = j.value("added_tokens", json::array());
  for (size_t k = 0; added.is_array() && k < added.size(); ++k) {
    const json& a = added[k];
    if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
        a["id"].get<int64_t>() < 0 || !a.contains("content") || !a["content"].is_string())
      throw Error(file + ": added_tokens[" + std::to_string(k) +
                  "] has no non-negative \"id\" or no \"content\" string");
    AddedToken token{a["content"].get<std::string>(), a["id"].get<int64_t>(),
                     flag(a, "lstrip", false),        flag(a, "rstrip", false),
                     flag(a, "single_word", false),   flag(a, "normalized", false)};
    if (token.content.empty()) continue;
    t.added_by_byte_[static_cast<unsigned char>(token.content[0])].push_back(t.added_.size());
    t.added_text_[token.id] = token.content;
    t.vocab_size_ = std::max(t.vocab_size_, token.id + 1);
    t.added_.push_back(std::move(token));
  }

  // bos and eos: tokenizer_config.json's tokens, else generation_config.json's ids.
  auto id_of = [&](const std::string& text) -> int64_t {
    if (text.empty()) return -1;
    for (const AddedToken& a : t.added_)
      if (a.content == text) return a.id;
    const auto v = t.vocab_.find(text);
    return v == t.vocab_.end() ? -1 : v->second;
  };
  const auto dir = tokenizer_json.parent_path();
  const json tokenizer_config = sibling_json(dir / "tokenizer_config.json");
  const json generation_config = sibling_json(dir / "generation_config.json");
  t.bos_ = id_of(token_text(tokenizer_config, "bos_token"));
  if (t.bos_ < 0) t.bos_ = config_id(generation_config, "bos_token_id");
  t.eot_ = id_of(token_text(tokenizer_config, "eos_token"));
  if (t.eot_ < 0) t.eot_ = config_id(generation_config, "eos_token_id");
  if (t.eot_ < 0) t.eot_ = id_of("<|endoftext|>");
  t.cache_ = std::make_shared<std::unordered_map<std::string, std::vector<int64_t>>>();
  return t;
}

namespace {

// Where the character that ends at byte `at` (> 0) of `text` starts.
size_t char_start_before(const std::string& text, size_t at) {
  size_t i = at - 1;
  while (i > 0 && at - i < 4 && (static_cast<unsigned char>(text[i]) >> 6) == 0x2) --i;
  return char_at(text, i).second == at - i ? i : at - 1;
}

// The code point that ends just before byte `at` of `text` (0 at the start).
uint32_t char_before(const std::string& text, size_t at) {
  return at == 0 ? 0 : char_at(text, char_start_before(text, at)).first;
}

// Rust's regex \w, which tokenizers tests a single_word token's neighbours against.
bool word_char(uint32_t cp) { return cp != 0 && in_ranges(kWordRanges, cp); }

}  // namespace

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<int64_t> ids;
  if (added_.empty() && !nfc_) {
    encode_text(text, ids);
    return ids;
  }
  // Added tokens that match the text as written first (leftmost, longest), then, inside the
  // normalized rest, those marked "normalized", as Hugging Face tokenizers' AddedVocabulary does.
  auto split = [&](const std::string& s, bool normalized, const auto& on_text) {
    size_t done = 0, i = 0;
    while (i < s.size()) {
      const AddedToken* best = nullptr;
      for (const size_t k : added_by_byte_[static_cast<unsigned char>(s[i])]) {
        const AddedToken& a = added_[k];
        if (a.normalized == normalized &&
            (best == nullptr || a.content.size() > best->content.size()) &&
            s.compare(i, a.content.size(), a.content) == 0)
          best = &a;
      }
      if (best == nullptr) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + best->content.size();
      i = stop;
      if (best->single_word && ((start > 0 && word_char(char_before(s, start))) ||
                                (stop < s.size() && word_char(char_at(s, stop).first))))
        continue;
      if (best->lstrip)
        while (start > done && is_space(char_before(s, start))) start = char_start_before(s, start);
      if (best->rstrip)
        while (stop < s.size() && is_space(char_at(s, stop).first)) stop += char_at(s, stop).second;
      if (done < start) on_text(s.substr(done, start - done));
      ids.push_back(best->id);
      done = i = stop;
    }
    if (done < s.size()) on_text(s.substr(done));
  };
  split(text, false, [&](const std::string& raw) {
    const std::string normalized = nfc_ ? nfc(raw) : raw;
    split(normalized, true, [&](const std::string& rest) { encode_text(rest, ids); });
  });
  return ids;
}

void BpeTokenizer::encode_text(const std::string& text, std::vector<int64_t>& ids) const {
  if (text.empty()) return;
  const std::string& in =
      !prefix_pieces_ && add_prefix_space_ && text[0] != ' ' ? " " + text : text;
  for (const std::string& piece : pretokenize(in, pattern_))
    encode_piece(prefix_pieces_ && add_prefix_space_ && piece[0] != ' ' ? " " + piece : piece, ids);
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<int64_t>& ids) const {
  static std::mutex cache_mutex;
  {
    const std::lock_guard<std::mutex> lock(cache_mutex);
    if (auto hit = cache_->find(piece); hit != cache_->end()) {
      ids.insert(ids.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  std::vector<int64_t> piece_ids;
  std::string whole;
  for (const char c : piece) whole += byte_symbol_[static_cast<unsigned char>(c)];
  // ignore_merges (Llama 3): a piece that is a vocabulary entry is that entry.
  if (const auto v = ignore_merges_ ? vocab_.find(whole) : vocab_.end(); v != vocab_.end()) {
    piece_ids.push_back(v->second);
  } else {
    std::vector<std::string> word;
    for (const char c : piece) word.push_back(byte_symbol_[static_cast<unsigned char>(c)]);
    while (word.size() > 1) {
      int best = std::numeric_limits<int>::max();
      size_t at = 0;
      for (size_t k = 0; k + 1 < word.size(); ++k) {
        const auto r = ranks_.find({word[k], word[k + 1]});
        if (r != ranks_.end() && r->second < best) {
          best = r->second;
          at = k;
        }
      }
      if (best == std::numeric_limits<int>::max()) break;
      const std::string first = word[at], second = word[at + 1];
      std::vector<std::string> merged;
      for (size_t k = 0; k < word.size();) {
        if (k + 1 < word.size() && word[k] == first && word[k + 1] == second) {
          merged.push_back(first + second);
          k += 2;
        } else {
          merged.push_back(word[k++]);
        }
      }
      word = std::move(merged);
    }
    for (const std::string& symbol : word) piece_ids.push_back(vocab_.at(symbol));
  }
  ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
  const std::lock_guard<std::mutex> lock(cache_mutex);
  if (cache_->size() > 200000) cache_->clear();
  cache_->emplace(piece, std::move(piece_ids));
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) {
    if (const auto a = added_text_.find(id); a != added_text_.end()) {
      out += a->second;
      continue;
    }
    const auto s = symbols_.find(id);
    if (s == symbols_.end())
      throw Error("BpeTokenizer::decode: id " + std::to_string(id) + " is not in the vocabulary");
    const std::string& symbol = s->second;
    if (id == eot_ || added_text_.count(id)) {
      out += symbol;
      continue;
    }
    for (size_t i = 0; i < symbol.size();) {
      const auto [cp, len] = char_at(symbol, i);
      (void)cp;
      const auto b = symbol_byte_.find(symbol.substr(i, len));
      if (b == symbol_byte_.end()) {
        out += symbol.substr(i, len);  // a special token's own text
      } else {
        out += static_cast<char>(b->second);
      }
      i += len;
    }
  }
  return out;
}

}  // namespace fabric
