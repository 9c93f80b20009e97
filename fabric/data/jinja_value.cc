// Python's value semantics for fabric::jinja (jinja_value.h): construction, printing, ==, ordering,
// arithmetic, indexing and slicing.
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

double as_double(const Value& v) {
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

}  // namespace fabric::jinja
