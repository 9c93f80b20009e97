// Unicode for the byte-level BPE tokenizers (bpe.h): UTF-8, the character classes of the
// pre-tokenizer patterns (\p{L}, \p{N}, \s, \w: tools/gen_unicode_classes.py's tables), NFC
// (tools/gen_unicode_nfc.py's tables) and the pre-tokenizers of GPT-2, Llama 3 and Qwen2.
#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "fabric/data/bpe.h"
#include "fabric/data/bpe_unicode.h"

namespace fabric {
namespace {

// One character of `text` at `i`: its code point and length (an invalid byte is a character of
// its own, U+FFFD).
std::pair<uint32_t, size_t> char_at_impl(const std::string& text, size_t i) {
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

// The length in characters of a contraction ('s 't 'm 'd: 2; 're 've 'll: 3) whose letters are
// `a` and `b` after the apostrophe, or 0. Both pre-tokenizers take these first.
size_t contraction_length(uint32_t a, uint32_t b) {
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
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
      const size_t len = contraction_length(lower(i + 1), lower(i + 2));  // case-insensitive
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

namespace bpe_unicode {

std::pair<uint32_t, size_t> char_at(const std::string& text, size_t i) {
  return char_at_impl(text, i);
}

std::string utf8_lossy(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const Utf8Sequence s = utf8_sequence(bytes, i);
    if (s.valid > 0) {
      out.append(bytes, i, s.valid);
    } else {
      append_utf8(out, 0xFFFD);  // the lead byte and the continuation bytes that fit it
    }
    i += s.span;
  }
  return out;
}

bool is_space(uint32_t cp) { return class_of(cp) == Class::kSpace; }

bool is_word_char(uint32_t cp) { return cp != 0 && in_ranges(kWordRanges, cp); }

}  // namespace bpe_unicode

using bpe_unicode::append_utf8;
using bpe_unicode::char_at;

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
      const size_t len =
          contraction_length(chars[i + 1].cp, i + 2 < n ? chars[i + 2].cp : 0);  // case-sensitive
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

}  // namespace fabric
