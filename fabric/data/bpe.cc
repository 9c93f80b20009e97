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

}  // namespace

std::vector<std::string> BpeTokenizer::pretokenize(const std::string& text) {
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
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0)
      throw Error(vocab_json.string() + ": \"" + it.key() + "\" has no non-negative integer id");
    const int64_t id = it.value().get<int64_t>();
    // Two symbols with one id: decoding could not tell them apart, and training data written
    // with one would decode as the other.
    if (const auto other = t.symbols_.find(id); other != t.symbols_.end())
      throw Error(vocab_json.string() + ": \"" + one_line(other->second, 40) + "\" and \"" +
                  one_line(it.key(), 40) + "\" share id " + std::to_string(id) +
                  "; each symbol needs its own id (a damaged or hand-edited vocabulary?)");
    t.vocab_[it.key()] = id;
    t.symbols_[id] = it.key();
    t.vocab_size_ = std::max(t.vocab_size_, id + 1);
  }
  for (int b = 0; b < 256; ++b)
    if (!t.vocab_.count(t.byte_symbol_[b]))
      throw Error(vocab_json.string() + ": no symbol for byte " + std::to_string(b) +
                  "; is it a byte-level BPE vocabulary (GPT-2's vocab.json / encoder.json)?");
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
    std::string a = line.substr(0, space), b = line.substr(space + 1);
    if (!t.vocab_.count(a + b))
      throw Error(merges_txt.string() + ":" + std::to_string(line_number) + ": the merge of '" + a +
                  "' and '" + b + "' is not in " + vocab_json.string() +
                  " (files of two different tokenizers?)");
    t.ranks_.emplace(std::make_pair(std::move(a), std::move(b)), rank++);
  }
  t.cache_ = std::make_shared<std::unordered_map<std::string, std::vector<int64_t>>>();
  return t;
}

std::vector<int64_t> BpeTokenizer::encode(const std::string& text) const {
  static std::mutex cache_mutex;
  std::vector<int64_t> ids;
  for (const std::string& piece : pretokenize(text)) {
    {
      const std::lock_guard<std::mutex> lock(cache_mutex);
      if (auto hit = cache_->find(piece); hit != cache_->end()) {
        ids.insert(ids.end(), hit->second.begin(), hit->second.end());
        continue;
      }
    }
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
    std::vector<int64_t> piece_ids;
    for (const std::string& symbol : word) piece_ids.push_back(vocab_.at(symbol));
    ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    const std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache_->size() > 200000) cache_->clear();
    cache_->emplace(piece, std::move(piece_ids));
  }
  return ids;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (const int64_t id : ids) {
    const auto s = symbols_.find(id);
    if (s == symbols_.end())
      throw Error("BpeTokenizer::decode: id " + std::to_string(id) + " is not in the vocabulary");
    const std::string& symbol = s->second;
    if (id == eot_) {
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
