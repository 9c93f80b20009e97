// Python's value semantics for fabric::jinja (jinja_value.h).
#include "fabric/data/jinja_value.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fabric/core/error.h"

namespace fabric::jinja {

Value Value::undefined(std::string why) {
  Value v;
  v.s = std::move(why);
  return v;
}
Value Value::none() {
  Value v;
  v.k = K::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.k = K::kBool;
  v.b = x;
  v.i = x ? 1 : 0;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.k = K::kInt;
  v.i = x;
  return v;
}
Value Value::real(double x) {
  Value v;
  v.k = K::kFloat;
  v.f = x;
  return v;
}
Value Value::str(std::string x) {
  Value v;
  v.k = K::kStr;
  v.s = std::move(x);
  return v;
}
Value Value::make_list(List x) {
  Value v;
  v.k = K::kList;
  v.list = std::make_shared<List>(std::move(x));
  return v;
}
Value Value::make_tuple(List x) {
  Value v = make_list(std::move(x));
  v.tuple = true;
  return v;
}
Value Value::make_dict(Dict x) {
  Value v;
  v.k = K::kDict;
  v.dict = std::make_shared<Dict>(std::move(x));
  return v;
}
Value Value::function(std::string name) {
  Value v;
  v.k = K::kFunction;
  v.s = std::move(name);
  return v;
}

const Value* dict_get(const Dict& d, const std::string& key) {
  for (const auto& [k, v] : d)
    if (k == key) return &v;
  return nullptr;
}

void dict_set(Dict& d, const std::string& key, Value v) {
  for (auto& [k, x] : d)
    if (k == key) {
      x = std::move(v);
      return;
    }
  d.emplace_back(key, std::move(v));
}

Value from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > 100) throw Error("a value nested more than 100 deep");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      if (j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        throw Error("the integer " + j.dump() + " is past 64 bits (this renderer's integers)");
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(from_json(x, depth + 1));
      return Value::make_list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& item : j.items())
        d.emplace_back(item.key(), from_json(item.value(), depth + 1));
      return Value::make_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

std::string type_name(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined:
      return "Undefined";
    case Value::K::kNone:
      return "NoneType";
    case Value::K::kBool:
      return "bool";
    case Value::K::kInt:
      return "int";
    case Value::K::kFloat:
      return "float";
    case Value::K::kStr:
      return "str";
    case Value::K::kList:
      return "list";
    case Value::K::kDict:
      return "dict";
    case Value::K::kNamespace:
      return "Namespace";
    case Value::K::kFunction:
      return "function";
  }
  return "object";
}

bool is_number(const Value& v) {
  return v.k == Value::K::kInt || v.k == Value::K::kFloat || v.k == Value::K::kBool;
}

static double as_double(const Value& v) {
  return v.k == Value::K::kFloat ? v.f : static_cast<double>(v.i);
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined:
    case Value::K::kNone:
      return false;
    case Value::K::kBool:
      return v.b;
    case Value::K::kInt:
      return v.i != 0;
    case Value::K::kFloat:
      return v.f != 0;
    case Value::K::kStr:
      return !v.s.empty();
    case Value::K::kList:
      return !v.list->empty();
    case Value::K::kDict:
      return !v.dict->empty();
    default:
      return true;
  }
}

// Python's repr(float): the shortest digits that read back the same.
static std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  for (int p = 1; p <= 17; ++p) {
    std::snprintf(buf, sizeof buf, "%.*e", p - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  std::string s = buf;
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      if (digits.size() <= static_cast<size_t>(exponent) + 1)
        digits.append(static_cast<size_t>(exponent) + 1 - digits.size(), '0');
      out = digits.substr(0, static_cast<size_t>(exponent) + 1) + ".";
      const std::string rest = digits.substr(static_cast<size_t>(exponent) + 1);
      out += rest.empty() ? "0" : rest;
    } else {
      out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1) + (digits.size() > 1 ? "." + digits.substr(1) : "");
    char ebuf[16];
    std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  }
  return (negative ? "-" : "") + out;
}

std::string repr(const Value& v) {
  if (v.k != Value::K::kStr) return to_str(v);
  const bool dq = v.s.find('\'') != std::string::npos && v.s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char c : v.s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == q || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + q;
}

std::string to_str(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined:
      return "";
    case Value::K::kNone:
      return "None";
    case Value::K::kBool:
      return v.b ? "True" : "False";
    case Value::K::kInt:
      return std::to_string(v.i);
    case Value::K::kFloat:
      return py_float(v.f);
    case Value::K::kStr:
      return v.s;
    case Value::K::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      return out + (v.tuple ? (v.list->size() == 1 ? ",)" : ")") : "]");
    }
    case Value::K::kDict:
    case Value::K::kNamespace: {
      std::string out = v.k == Value::K::kNamespace ? "<Namespace {" : "{";
      for (size_t k = 0; k < v.dict->size(); ++k)
        out += (k ? ", " : "") + repr(Value::str((*v.dict)[k].first)) + ": " +
               repr((*v.dict)[k].second);
      return out + (v.k == Value::K::kNamespace ? "}>" : "}");
    }
    case Value::K::kFunction:
      return "<function " + v.s + ">";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (is_number(a) && is_number(b)) {
    if (a.k == Value::K::kFloat || b.k == Value::K::kFloat) return as_double(a) == as_double(b);
    return a.i == b.i;
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case Value::K::kUndefined:
    case Value::K::kNone:
      return true;
    case Value::K::kStr:
    case Value::K::kFunction:
      return a.s == b.s;
    case Value::K::kList:
      return a.tuple == b.tuple && a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), equal);
    case Value::K::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* other = dict_get(*b.dict, k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    case Value::K::kNamespace:
      return a.dict == b.dict;
    default:
      return false;
  }
}

// -1, 0, 1; `why` set when Python would raise TypeError.
static int order(const Value& a, const Value& b, const std::string& op, std::string& why) {
  if (is_number(a) && is_number(b)) {
    if (a.k != Value::K::kFloat && b.k != Value::K::kFloat) return a.i < b.i ? -1 : a.i > b.i;
    const double x = as_double(a), y = as_double(b);
    return x < y ? -1 : x > y;
  }
  if (a.k == Value::K::kStr && b.k == Value::K::kStr) {
    const int c = a.s.compare(b.s);  // UTF-8's byte order is its code points' order
    return c < 0 ? -1 : c > 0;
  }
  if (a.k == Value::K::kList && b.k == Value::K::kList) {
    for (size_t k = 0; k < std::min(a.list->size(), b.list->size()); ++k) {
      if (equal((*a.list)[k], (*b.list)[k])) continue;
      return order((*a.list)[k], (*b.list)[k], op, why);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size();
  }
  why = "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
        type_name(b) + "'";
  return 0;
}

bool compare(const std::string& op, const Value& a, const Value& b, std::string& why) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.k == Value::K::kStr) {
      if (a.k != Value::K::kStr) {
        why = "'in <string>' requires string as left operand, not " + type_name(a);
        return false;
      }
      found = b.s.find(a.s) != std::string::npos;
    } else if (b.k == Value::K::kList) {
      found =
          std::any_of(b.list->begin(), b.list->end(), [&](const Value& x) { return equal(a, x); });
    } else if (b.k == Value::K::kDict || b.k == Value::K::kNamespace) {
      found = a.k == Value::K::kStr && dict_get(*b.dict, a.s) != nullptr;
    } else if (b.k != Value::K::kUndefined) {
      why = "argument of type '" + type_name(b) + "' is not iterable";
      return false;
    }
    return op == "in" ? found : !found;
  }
  const int c = order(a, b, op, why);
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;  // ">="
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

Value binary(const std::string& op, const Value& a, const Value& b, std::string& why) {
  if (op == "~") return Value::str(to_str(a) + to_str(b));
  for (const Value* v : {&a, &b})
    if (v->k == Value::K::kUndefined) {
      why = v->s;
      return Value::none();
    }
  const bool ints = (a.k == Value::K::kInt || a.k == Value::K::kBool) &&
                    (b.k == Value::K::kInt || b.k == Value::K::kBool);
  // Python's integers have no bounds; ours are 64-bit, and a result past them is an error.
  const char* const kOverflow = "integer overflow (this renderer's integers are 64-bit)";
  if (is_number(a) && is_number(b)) {
    const double x = as_double(a), y = as_double(b);
    int64_t r = 0;
    if (ints && (op == "+" || op == "-" || op == "*")) {
      const bool over = op == "+"   ? __builtin_add_overflow(a.i, b.i, &r)
                        : op == "-" ? __builtin_sub_overflow(a.i, b.i, &r)
                                    : __builtin_mul_overflow(a.i, b.i, &r);
      if (over) why = kOverflow;
      return Value::integer(r);
    }
    if (op == "+") return Value::real(x + y);
    if (op == "-") return Value::real(x - y);
    if (op == "*") return Value::real(x * y);
    if (op == "**") {
      if (x == 0 && y < 0) {
        why = "0.0 cannot be raised to a negative power";
        return Value::none();
      }
      if (ints && b.i >= 0) {  // square and multiply
        int64_t base = a.i, e = b.i;
        r = 1;
        while (e > 0) {
          if ((e & 1) && __builtin_mul_overflow(r, base, &r)) why = kOverflow;
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) why = kOverflow;
          if (!why.empty()) return Value::none();
        }
        return Value::integer(r);
      }
      return Value::real(std::pow(x, y));
    }
    if (y == 0) {
      why = ints && op != "/" ? "integer division or modulo by zero" : "division by zero";
      return Value::none();
    }
    if (op == "/") return Value::real(x / y);
    if (ints && b.i == -1) {  // INT64_MIN / -1 traps
      if (op == "%") return Value::integer(0);
      if (a.i == INT64_MIN) why = kOverflow;
      return Value::integer(-a.i);
    }
    if (op == "//") {
      if (!ints) return Value::real(std::floor(x / y));
      int64_t q = a.i / b.i;
      if ((a.i % b.i != 0) && ((a.i < 0) != (b.i < 0))) --q;
      return Value::integer(q);
    }
    if (op == "%") {
      if (!ints) {
        double r = std::fmod(x, y);
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return Value::real(r);
      }
      int64_t r = a.i % b.i;
      if (r != 0 && ((r < 0) != (b.i < 0))) r += b.i;
      return Value::integer(r);
    }
  }
  if (op == "+" && a.k == Value::K::kStr && b.k == Value::K::kStr) return Value::str(a.s + b.s);
  if (op == "+" && a.k == Value::K::kList && b.k == Value::K::kList) {
    List l = *a.list;
    l.insert(l.end(), b.list->begin(), b.list->end());
    return Value::make_list(std::move(l));
  }
  if (op == "*" && (a.k == Value::K::kStr || a.k == Value::K::kList) &&
      (b.k == Value::K::kInt || b.k == Value::K::kBool))
    return binary("*", b, a, why);
  if (op == "%" && a.k == Value::K::kStr)  // printf-style: 'Hello %s' % name
    return Value::str(percent_format(a.s, b.k == Value::K::kList ? *b.list : List{b}, why));
  if (op == "*" && (a.k == Value::K::kInt || a.k == Value::K::kBool)) {
    const size_t unit = b.k == Value::K::kStr    ? b.s.size()
                        : b.k == Value::K::kList ? b.list->size()
                                                 : 0;
    if (a.i > 0 && unit > 0 && static_cast<uint64_t>(a.i) > (size_t{1} << 27) / unit) {
      why = "a repeated " + type_name(b) + " of more than 2^27 items";
      return Value::none();
    }
    if (b.k == Value::K::kStr) {
      std::string s;
      for (int64_t k = 0; k < a.i; ++k) s += b.s;
      return Value::str(std::move(s));
    }
    if (b.k == Value::K::kList) {
      List l;
      for (int64_t k = 0; k < a.i; ++k) l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l));
    }
  }
  if (op == "+" && a.k == Value::K::kStr)
    why = "can only concatenate str (not \"" + type_name(b) + "\") to str";
  else
    why = "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
          type_name(b) + "'";
  return Value::none();
}

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

Value index(const Value& v, int64_t i) {
  if (v.k == Value::K::kList) {
    const auto n = static_cast<int64_t>(v.list->size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("list object has no element " + std::to_string(i));
    return (*v.list)[static_cast<size_t>(i)];
  }
  const std::vector<std::string> cps = code_points(v.s);
  const auto n = static_cast<int64_t>(cps.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return Value::undefined("str object has no element " + std::to_string(i));
  return Value::str(cps[static_cast<size_t>(i)]);
}

Value slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
            std::optional<int64_t> step, std::string& why) {
  if (v.k != Value::K::kList && v.k != Value::K::kStr) {
    why = "'" + type_name(v) + "' object is not subscriptable";
    return Value::none();
  }
  const int64_t s = step.value_or(1);
  if (s == 0) {
    why = "slice step cannot be zero";
    return Value::none();
  }
  std::vector<std::string> cps;
  if (v.k == Value::K::kStr) cps = code_points(v.s);
  const auto n = static_cast<int64_t>(v.k == Value::K::kList ? v.list->size() : cps.size());
  auto clamp = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t y = *x < 0 ? *x + n : *x;
    if (s > 0) return std::clamp<int64_t>(y, 0, n);
    return std::clamp<int64_t>(y, -1, n - 1);
  };
  const int64_t b = clamp(start, s > 0 ? 0 : n - 1), e = clamp(stop, s > 0 ? n : -1);
  List items;
  std::string text;
  for (int64_t k = b; s > 0 ? k < e : k > e; k += s) {
    if (v.k == Value::K::kList)
      items.push_back((*v.list)[static_cast<size_t>(k)]);
    else
      text += cps[static_cast<size_t>(k)];
  }
  return v.k == Value::K::kList ? Value::make_list(std::move(items)) : Value::str(std::move(text));
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
