// Jinja's lexer rules as transformers configures them (jinja_syntax.h).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "fabric/core/error.h"
#include "fabric/data/jinja_syntax.h"

namespace fabric::jinja {
namespace {

// Python's whitespace (str.isspace: Unicode's too) at the end of `s`, or at `pos` of `s`.
std::string rstrip_space(const std::string& s) { return strip(s, nullptr, false, true); }
size_t skip_space(const std::string& s, size_t pos) {
  while (pos < s.size()) {
    const auto c = static_cast<unsigned char>(s[pos]);
    const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (!is_py_space(s.substr(pos, n))) break;
    pos += n;
  }
  return pos;
}

// Python's string-literal escapes, as jinja2 decodes them ("unicode-escape"); `why` gets what
// Python refuses (a short \x, \u or \U, a code point past U+10FFFF or a surrogate).
std::string unescape(const std::string& body, std::string& why) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out += body[i];
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t digits) -> long {
      if (i + digits >= body.size()) return -1;  // the digits are body[i + 1 .. i + digits]
      const std::string h = body.substr(i + 1, digits);
      if (h.size() != digits || h.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
        return -1;
      i += digits;
      return std::strtol(h.c_str(), nullptr, 16);
    };
    switch (c) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // a line continuation
      case 'x':
      case 'u':
      case 'U': {
        const long cp = hex(c == 'x' ? 2 : c == 'u' ? 4 : 8);
        if (cp < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
          why = std::string("a string's \\") + c +
                (cp < 0 ? " escape lacks its hex digits" : " escape is not a character");
          return out;
        }
        append_utf8(out, static_cast<uint32_t>(cp));
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t n = 0;
          while (n < 3 && i < body.size() && body[i] >= '0' && body[i] <= '7') {
            v = v * 8 + static_cast<uint32_t>(body[i++] - '0');
            ++n;
          }
          --i;
          append_utf8(out, v);
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(const std::string& source, const std::string& origin) : origin_(origin) {
    // Newlines as "\n"; one trailing newline dropped (keep_trailing_newline=False).
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Piece> run() {
    std::vector<Piece> pieces;
    size_t pos = 0;
    int line = 1;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t start = pos;
      char kind = 0;
      for (; start + 1 < src_.size(); ++start)
        if (src_[start] == '{' &&
            (src_[start + 1] == '{' || src_[start + 1] == '%' || src_[start + 1] == '#')) {
          kind = src_[start + 1];
          break;
        }
      if (kind == 0) {
        pieces.push_back({Piece::K::kText, src_.substr(pos), {}, line});
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      const char sign = start + 2 < src_.size() ? src_[start + 2] : 0;
      if (sign == '-') {
        text = rstrip_space(text);              // Python's whitespace, as jinja's str.rstrip()
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t l_pos = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            rstrip_space(text.substr(l_pos)).empty())
          text.resize(l_pos);
      }
      if (!text.empty()) pieces.push_back({Piece::K::kText, text, {}, line});
      line += static_cast<int>(std::count(src_.begin() + static_cast<long>(pos),
                                          src_.begin() + static_cast<long>(start), '\n'));
      pos = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      const int tag_line = line;
      char close = 0;  // '-', '+' or 0: the sign before the tag's end
      if (kind == '#') {
        const size_t end = src_.find("#}", pos);
        if (end == std::string::npos) fail(tag_line, "a comment {# is never closed with #}");
        if (end > pos && (src_[end - 1] == '-' || src_[end - 1] == '+')) close = src_[end - 1];
        line += static_cast<int>(std::count(src_.begin() + static_cast<long>(pos),
                                            src_.begin() + static_cast<long>(end), '\n'));
        pos = end + 2;
      } else {
        Piece p{kind == '{' ? Piece::K::kOutput : Piece::K::kBlock, "", {}, tag_line};
        pos = tag_tokens(pos, kind == '{' ? '}' : '%', line, p.tokens, close);
        pieces.push_back(std::move(p));
      }
      // After the tag: "-" eats all whitespace; a block or comment eats one newline.
      const size_t after = pos;
      if (close == '-') {
        pos = skip_space(src_, pos);
      } else if (close != '+' && kind != '{' && pos < src_.size() && src_[pos] == '\n') {
        ++pos;
      }
      line += static_cast<int>(std::count(src_.begin() + static_cast<long>(after),
                                          src_.begin() + static_cast<long>(pos), '\n'));
      line_starting = pos > after && src_[pos - 1] == '\n';
    }
    return pieces;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw Error(origin_ + ": line " + std::to_string(line) + ": " + what);
  }

  // The tokens of a tag from `pos` to its end ("}}" or "%}", after an optional '-' or '+');
  // returns the position after the end.
  size_t tag_tokens(size_t pos, char end_char, int& line, std::vector<Token>& out, char& close) {
    int depth = 0;  // open ( [ {: an end mark inside them is not the tag's end
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) {
        if (src_[pos] == '\n') ++line;
        ++pos;
      }
      if (pos >= src_.size())
        fail(line, std::string("a tag is never closed with ") + end_char + "}");
      if (depth == 0) {
        for (const char sign : {'-', '+', '\0'}) {
          if (sign == '+' && end_char == '}') continue;
          const std::string mark = (sign ? std::string(1, sign) : "") + end_char + "}";
          if (src_.compare(pos, mark.size(), mark) == 0) {
            close = sign;
            out.push_back({Token::T::kEnd, "", 0, 0, line});
            return pos + mark.size();
          }
        }
      }
      Token t;
      t.line = line;
      const char c = src_[pos];
      if (c == '\'' || c == '"') {
        size_t i = pos + 1;
        while (i < src_.size() && src_[i] != c) i += src_[i] == '\\' ? 2 : 1;
        if (i >= src_.size()) fail(line, "a string is never closed");
        const std::string body = src_.substr(pos + 1, i - pos - 1);
        line += static_cast<int>(std::count(body.begin(), body.end(), '\n'));
        t.t = Token::T::kStr;
        std::string why;
        t.s = unescape(body, why);
        if (!why.empty()) fail(line, why);
        pos = i + 1;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t i = pos;
        while (i < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[i])) || src_[i] == '_'))
          ++i;
        bool real = false;
        if (i + 1 < src_.size() && src_[i] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[i + 1]))) {
          real = true;
          ++i;
          while (i < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[i])) || src_[i] == '_'))
            ++i;
        }
        if (i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
          size_t j = i + 1;
          if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
          if (j < src_.size() && std::isdigit(static_cast<unsigned char>(src_[j]))) {
            real = true;
            i = j;
            while (i < src_.size() && std::isdigit(static_cast<unsigned char>(src_[i]))) ++i;
          }
        }
        std::string digits = src_.substr(pos, i - pos);
        digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
        if (real) {
          t.t = Token::T::kFloat;
          t.f = std::strtod(digits.c_str(), nullptr);
        } else {
          t.t = Token::T::kInt;
          errno = 0;
          t.i = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) fail(line, "the integer " + digits + " is past 64 bits");
        }
        pos = i;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t i = pos;
        while (i < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[i])) || src_[i] == '_'))
          ++i;
        t.t = Token::T::kName;
        t.s = src_.substr(pos, i - pos);
        pos = i;
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                           "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                           ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        const char* op = nullptr;
        for (const char* o : kOps)
          if (src_.compare(pos, std::char_traits<char>::length(o), o) == 0) {
            op = o;
            break;
          }
        if (op == nullptr) fail(line, std::string("unexpected character '") + c + "'");
        t.t = Token::T::kOp;
        t.s = op;
        pos += t.s.size();
        if (t.s == "(" || t.s == "[" || t.s == "{") ++depth;
        if ((t.s == ")" || t.s == "]" || t.s == "}") && depth > 0) --depth;
      }
      out.push_back(std::move(t));
    }
  }

  std::string src_;
  const std::string& origin_;
};

}  // namespace

std::vector<Piece> lex(const std::string& source, const std::string& origin) {
  return Lexer(source, origin).run();
}

}  // namespace fabric::jinja
