#include "fabric/core/error.h"

#include <cstdio>

namespace fabric {

std::string one_line(const std::string& text, std::size_t max_chars) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (i < text.size()) out += "...";
  return out;
}

}  // namespace fabric
