#include "fabric/core/utf8.h"

namespace fabric {

Utf8Sequence utf8_sequence(std::string_view bytes, size_t i) {
  const size_t n = bytes.size();
  const auto c = static_cast<unsigned char>(bytes[i]);
  if (c < 0x80) return {1, 1};
  // The sequence's length and the range its second byte must lie in (no overlongs, no
  // surrogates, nothing above U+10FFFF); the later bytes lie in 80..BF.
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  }
  size_t k = 1;
  while (len > 0 && k < len && i + k < n) {
    const auto d = static_cast<unsigned char>(bytes[i + k]);
    if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
    ++k;
  }
  return {len > 0 && k == len ? len : 0, k};
}

size_t first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t valid = utf8_sequence(text, i).valid;
    if (valid == 0) return i;
    i += valid;
  }
  return std::string_view::npos;
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

}  // namespace fabric
