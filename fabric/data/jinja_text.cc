// Python's str for fabric::jinja (jinja_value.h): code points and whitespace, the str and dict
// methods templates call, printf-style % formatting, and json.dumps.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fabric/data/jinja_value.h"

namespace fabric::jinja {

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t decode_cp(const std::string& c) {
  const auto b = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(c[k])); };
  if (c.empty()) return 0;
  if (c.size() == 1) return b(0) < 0x80 ? b(0) : 0xFFFD;
  if (c.size() == 2) return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
  if (c.size() == 3) return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
}

// Python's str.isspace() for one code point.
static bool py_space(const std::string& c) {
  const uint32_t cp = decode_cp(c);
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_py_space(const std::string& c) { return py_space(c); }

std::string strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::vector<std::string> cps = code_points(s);
  std::vector<std::string> set;
  if (chars) set = code_points(*chars);
  auto strippable = [&](const std::string& c) {
    return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_space(c);
  };
  size_t begin = 0, end = cps.size();
  while (left && begin < end && strippable(cps[begin])) ++begin;
  while (right && end > begin && strippable(cps[end - 1])) --end;
  std::string out;
  for (size_t k = begin; k < end; ++k) out += cps[k];
  return out;
}

std::string percent_format(const std::string& fmt, const List& args, std::string& why) {
  std::string out;
  size_t next = 0;
  for (size_t k = 0; k < fmt.size(); ++k) {
    if (fmt[k] != '%') {
      out += fmt[k];
      continue;
    }
    // %[flags][width][.precision]type, as C's printf reads it (Python's are the same)
    size_t end = k + 1;
    while (end < fmt.size() && std::strchr("-+ #0", fmt[end]) != nullptr) ++end;
    while (end < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[end]))) ++end;
    if (end < fmt.size() && fmt[end] == '.') {
      ++end;
      while (end < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[end]))) ++end;
    }
    if (end >= fmt.size()) {
      why = "incomplete format";
      return out;
    }
    const char type = fmt[end];
    std::string spec = fmt.substr(k, end - k);
    k = end;
    if (type == '%') {
      out += '%';
      continue;
    }
    if (next >= args.size()) {
      why = "not enough arguments for format string";
      return out;
    }
    const Value& x = args[next++];
    char buf[512];
    if (type == 's' || type == 'r') {
      const std::string text = type == 's' ? to_str(x) : repr(x);
      std::snprintf(buf, sizeof buf, (spec + "s").c_str(), "");
      const size_t width = std::strlen(buf);  // the padding a width asks for, at least
      const size_t cps = code_points(text).size();
      const std::string pad(width > cps ? width - cps : 0, ' ');
      out += spec.find('-') != std::string::npos ? text + pad : pad + text;
    } else if (std::strchr("diouxXc", type) != nullptr && is_number(x)) {
      const auto v = static_cast<long long>(x.k == Value::K::kFloat ? x.f : x.i);
      if (type == 'c') {
        append_utf8(out, static_cast<uint32_t>(v));
        continue;
      }
      std::snprintf(buf, sizeof buf,
                    (spec + "ll" + (type == 'i' || type == 'u' ? 'd' : type)).c_str(), v);
      out += buf;
    } else if (std::strchr("eEfFgG", type) != nullptr && is_number(x)) {
      std::snprintf(buf, sizeof buf, (spec + type).c_str(), as_double(x));
      out += buf;
    } else {
      why = std::string("%") + type + " format: " +
            (is_number(x) ? "unsupported format character"
                          : "a number is required, not " + type_name(x));
      return out;
    }
  }
  if (next < args.size()) why = "not all arguments converted during string formatting";
  return out;
}

bool is_method(const Value& self, const std::string& name) {
  static const std::vector<std::string> kStr = {
      "strip",    "lstrip",  "rstrip",  "split",   "rsplit",     "startswith",
      "endswith", "upper",   "lower",   "title",   "capitalize", "replace",
      "find",     "rfind",   "count",   "join",    "splitlines", "isdigit",
      "isalpha",  "isalnum", "isspace", "islower", "isupper"};
  static const std::vector<std::string> kDict = {"items", "keys", "values", "get"};
  const auto& names = self.k == Value::K::kStr    ? kStr
                      : self.k == Value::K::kDict ? kDict
                                                  : std::vector<std::string>{};
  return std::find(names.begin(), names.end(), name) != names.end();
}

static std::string ascii_case(std::string s, bool upper) {
  for (char& c : s)
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Python's str.split / rsplit (sep none: runs of whitespace; maxsplit < 0: all).
static List split(const std::string& s, const Value* sep, int64_t maxsplit, bool from_right,
                  std::string& why) {
  std::vector<std::string> parts;
  if (sep == nullptr || sep->k == Value::K::kNone) {
    const std::vector<std::string> cps = code_points(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in code points
    for (size_t k = 0; k < cps.size();) {
      while (k < cps.size() && py_space(cps[k])) ++k;
      if (k == cps.size()) break;
      const size_t b = k;
      while (k < cps.size() && !py_space(cps[k])) ++k;
      words.emplace_back(b, k);
    }
    auto join = [&](size_t b, size_t e) {
      std::string w;
      for (size_t k = b; k < e; ++k) w += cps[k];
      return w;
    };
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) + 1 >= words.size()) {
      for (const auto& [b, e] : words) parts.push_back(join(b, e));
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) parts.push_back(join(words[k].first, words[k].second));
      // the rest from the next word on, its trailing space kept
      parts.push_back(join(words[static_cast<size_t>(maxsplit)].first, cps.size()));
    } else {  // the rest up to the word before, its leading space kept
      const size_t keep = words.size() - static_cast<size_t>(maxsplit);
      parts.push_back(join(0, words[keep - 1].second));
      for (size_t k = keep; k < words.size(); ++k)
        parts.push_back(join(words[k].first, words[k].second));
    }
  } else {
    if (sep->k != Value::K::kStr || sep->s.empty()) {
      why = sep->k == Value::K::kStr ? "empty separator"
                                     : "must be str or None, not " + type_name(*sep);
      return {};
    }
    const std::string& d = sep->s;
    std::vector<size_t> cuts;  // separator positions, found from the left (rsplit: the right)
    const size_t most = maxsplit < 0 ? SIZE_MAX : static_cast<size_t>(maxsplit);
    if (!from_right) {
      for (size_t at = s.find(d); at != std::string::npos && cuts.size() < most;
           at = s.find(d, at + d.size()))
        cuts.push_back(at);
    } else if (s.size() >= d.size()) {
      for (size_t at = s.rfind(d); at != std::string::npos && cuts.size() < most;
           at = at >= d.size() ? s.rfind(d, at - d.size()) : std::string::npos)
        cuts.push_back(at);
      std::reverse(cuts.begin(), cuts.end());
    }
    size_t b = 0;
    for (const size_t c : cuts) {
      parts.push_back(s.substr(b, c - b));
      b = c + d.size();
    }
    parts.push_back(s.substr(b));
  }
  List out;
  for (auto& p : parts) out.push_back(Value::str(std::move(p)));
  return out;
}

Value call_method(const Value& self, const std::string& name, const std::vector<Value>& pos,
                  const std::vector<std::pair<std::string, Value>>& kw, std::string& why) {
  auto arg = [&](size_t i, const char* key) -> const Value* {
    if (i < pos.size()) return &pos[i];
    for (const auto& [k, v] : kw)
      if (k == key) return &v;
    return nullptr;
  };
  auto str_arg = [&](size_t i, const char* key) -> const std::string* {
    const Value* v = arg(i, key);
    if (v == nullptr || v->k == Value::K::kNone) return nullptr;
    if (v->k != Value::K::kStr) why = name + "() takes a string, not " + type_name(*v);
    return v->k == Value::K::kStr ? &v->s : nullptr;
  };
  if (self.k == Value::K::kDict) {
    if (name == "get") {
      const Value* key = arg(0, "key");
      const Value* dflt = arg(1, "default");
      const Value* found = key && key->k == Value::K::kStr ? dict_get(*self.dict, key->s) : nullptr;
      return found ? *found : dflt ? *dflt : Value::none();
    }
    List out;
    for (const auto& [k, v] : *self.dict) {
      if (name == "keys")
        out.push_back(Value::str(k));
      else if (name == "values")
        out.push_back(v);
      else
        out.push_back(Value::make_tuple({Value::str(k), v}));
    }
    return Value::make_list(std::move(out));
  }
  const std::string& s = self.s;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const std::string* chars = str_arg(0, "chars");
    return Value::str(strip(s, chars, name[0] != 'r', name[0] != 'l'));
  }
  if (name == "upper" || name == "lower") return Value::str(ascii_case(s, name == "upper"));
  if (name == "capitalize") {
    std::string out = ascii_case(s, false);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return Value::str(out);
  }
  if (name == "title") {
    std::string out = s;
    bool after_letter = false;
    for (char& c : out) {
      const auto u = static_cast<unsigned char>(c);
      const bool letter = std::isalpha(u) || u >= 0x80;
      if (std::isalpha(u)) c = static_cast<char>(after_letter ? std::tolower(u) : std::toupper(u));
      after_letter = letter;
    }
    return Value::str(out);
  }
  if (name == "split" || name == "rsplit") {
    const Value* maxsplit = arg(1, "maxsplit");
    List parts = split(s, arg(0, "sep"), maxsplit ? maxsplit->i : -1, name == "rsplit", why);
    return Value::make_list(std::move(parts));
  }
  if (name == "splitlines") {
    List out;
    size_t b = 0;
    for (size_t k = 0; k < s.size(); ++k)
      if (s[k] == '\n' || s[k] == '\r') {
        out.push_back(Value::str(s.substr(b, k - b)));
        if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
        b = k + 1;
      }
    if (b < s.size()) out.push_back(Value::str(s.substr(b)));
    return Value::make_list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = arg(0, "prefix");
    std::vector<std::string> options;
    if (p && p->k == Value::K::kStr)
      options.push_back(p->s);
    else if (p && p->k == Value::K::kList)
      for (const Value& x : *p->list) options.push_back(to_str(x));
    else
      why = name + "() takes a string or a tuple of strings";
    for (const std::string& o : options)
      if (o.size() <= s.size() &&
          s.compare(name[0] == 's' ? 0 : s.size() - o.size(), o.size(), o) == 0)
        return Value::boolean(true);
    return Value::boolean(false);
  }
  if (name == "replace") {
    const std::string* old = str_arg(0, "old");
    const std::string* rep = str_arg(1, "new");
    const Value* count = arg(2, "count");
    if (!old || !rep) {
      if (why.empty()) why = "replace() takes two strings";
      return Value::none();
    }
    int64_t left = count && count->k == Value::K::kInt ? count->i : -1;
    std::string out;
    if (old->empty()) {
      for (const std::string& c : code_points(s)) {
        if (left != 0) {
          out += *rep;
          --left;
        }
        out += c;
      }
      if (left != 0) out += *rep;
      return Value::str(out);
    }
    size_t b = 0;
    for (size_t at = s.find(*old); at != std::string::npos && left != 0;
         at = s.find(*old, b), --left) {
      out += s.substr(b, at - b) + *rep;
      b = at + old->size();
    }
    return Value::str(out + s.substr(b));
  }
  if (name == "find" || name == "rfind" || name == "count") {
    const std::string* sub = str_arg(0, "sub");
    if (!sub) {
      if (why.empty()) why = name + "() takes a string";
      return Value::none();
    }
    if (name == "count") {
      int64_t n = 0;
      if (sub->empty()) return Value::integer(static_cast<int64_t>(code_points(s).size()) + 1);
      for (size_t at = s.find(*sub); at != std::string::npos; at = s.find(*sub, at + sub->size()))
        ++n;
      return Value::integer(n);
    }
    const size_t at = name == "find" ? s.find(*sub) : s.rfind(*sub);
    if (at == std::string::npos) return Value::integer(-1);
    return Value::integer(static_cast<int64_t>(code_points(s.substr(0, at)).size()));
  }
  if (name == "join") {
    const Value* items = arg(0, "iterable");
    if (!items || items->k != Value::K::kList) {
      why = "join() takes a list of strings";
      return Value::none();
    }
    std::string out;
    for (size_t k = 0; k < items->list->size(); ++k) {
      if ((*items->list)[k].k != Value::K::kStr) {
        why = "sequence item " + std::to_string(k) + ": expected str instance, " +
              type_name((*items->list)[k]) + " found";
        return Value::none();
      }
      out += (k ? s : "") + (*items->list)[k].s;
    }
    return Value::str(out);
  }
  // isdigit, isalpha, isalnum, isspace, islower, isupper (ASCII)
  if (s.empty()) return Value::boolean(false);
  if (name == "isspace") {
    for (const std::string& c : code_points(s))
      if (!py_space(c)) return Value::boolean(false);
    return Value::boolean(true);
  }
  bool cased = false, ok = true;
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (name == "isdigit") ok = ok && std::isdigit(u);
    if (name == "isalpha") ok = ok && std::isalpha(u);
    if (name == "isalnum") ok = ok && std::isalnum(u);
    if (name == "islower") ok = ok && !std::isupper(u);
    if (name == "isupper") ok = ok && !std::islower(u);
    cased = cased || std::isalpha(u);
  }
  if (name == "islower" || name == "isupper") ok = ok && cased;
  return Value::boolean(ok);
}

static void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (const std::string& c : code_points(s)) {
    const uint32_t cp = decode_cp(c);
    char buf[16];
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7f)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof buf, "\\u%04x", cp);
          }
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

static void json_value(const Value& v, const JsonStyle& st, int level, std::string& out,
                       std::string& why) {
  if (!why.empty()) return;
  auto newline = [&](int l) {
    if (!st.newlines) return;
    out += '\n';
    for (int k = 0; k < l; ++k) out += st.indent;
  };
  switch (v.k) {
    case Value::K::kNone:
      out += "null";
      return;
    case Value::K::kBool:
      out += v.b ? "true" : "false";
      return;
    case Value::K::kInt:
      out += std::to_string(v.i);
      return;
    case Value::K::kFloat:
      out += std::isnan(v.f)   ? "NaN"
             : std::isinf(v.f) ? (v.f > 0 ? "Infinity" : "-Infinity")
                               : to_str(v);
      return;
    case Value::K::kStr:
      json_string(v.s, st.ensure_ascii, out);
      return;
    case Value::K::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        json_value((*v.list)[k], st, level + 1, out, why);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::K::kDict: {
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      Dict items = *v.dict;
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        newline(level + 1);
        json_string(items[k].first, st.ensure_ascii, out);
        out += st.key_sep;
        json_value(items[k].second, st, level + 1, out, why);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      why = "Object of type " + type_name(v) + " is not JSON serializable";
  }
}

std::string to_json(const Value& v, const JsonStyle& style, std::string& why) {
  std::string out;
  json_value(v, style, 0, out, why);
  return out;
}

}  // namespace fabric::jinja
