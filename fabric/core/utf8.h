// Well-formed UTF-8 (the Unicode Standard's table 3-7: no overlong forms, no surrogates
// U+D800..U+DFFF, nothing above U+10FFFF), for every reader of text a user hands in: a tokenizer's
// input files (fabric/data) and command-line config values (fabric/config).
#ifndef FABRIC_CORE_UTF8_H_
#define FABRIC_CORE_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fabric {

// The UTF-8 sequence at byte `i` of `bytes` (i < size): `valid`, its length when well-formed (1 to
// 4), else 0; `span`, the bytes of its maximal subpart (what one U+FFFD replaces under the
// Standard's "substitution of maximal subparts").
struct Utf8Sequence {
  size_t valid = 0, span = 1;
};
Utf8Sequence utf8_sequence(std::string_view bytes, size_t i);

// The offset of the first byte of `text` that does not start a well-formed sequence, or npos.
size_t first_invalid_utf8(std::string_view text);

// Appends code point `cp` (at most U+10FFFF) to `out` as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

}  // namespace fabric

#endif  // FABRIC_CORE_UTF8_H_
