// What bpe.cc takes from bpe_unicode.cc (internal to //fabric/data:bpe, not installed): UTF-8
// and the character classes the added tokens' lstrip/rstrip/single_word look at.
#ifndef FABRIC_DATA_BPE_UNICODE_H_
#define FABRIC_DATA_BPE_UNICODE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "fabric/core/utf8.h"

namespace fabric::bpe_unicode {

// Appends code point `cp` to `out` as UTF-8: fabric/core/utf8.h.
using fabric::append_utf8;
// The character of `text` at byte `i`: its code point and length in bytes (an invalid byte is a
// character of its own, U+FFFD).
std::pair<uint32_t, size_t> char_at(const std::string& text, size_t i);
// `bytes` as valid UTF-8: each maximal ill-formed subsequence replaced by U+FFFD (the Unicode
// Standard's "substitution of maximal subparts", what Rust's String::from_utf8_lossy and so
// `tokenizers`' byte-level decoding do).
std::string utf8_lossy(const std::string& bytes);
// The UTF-8 sequence at a byte: fabric/core/utf8.h.
using fabric::utf8_sequence;
using fabric::Utf8Sequence;
// Unicode White_Space.
bool is_space(uint32_t cp);
// A word character as Rust's regex \w sees it (single_word added tokens).
bool is_word_char(uint32_t cp);

}  // namespace fabric::bpe_unicode

#endif  // FABRIC_DATA_BPE_UNICODE_H_
