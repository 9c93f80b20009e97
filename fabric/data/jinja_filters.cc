// jinja's filters and tests, attribute and item access (jinja_ops.h).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <unordered_map>

#include "fabric/core/error.h"
#include "fabric/data/jinja_ops.h"
#include "fabric/data/jinja_syntax.h"

namespace fabric::jinja {
namespace {

const std::set<std::string> kFilters = {
    "abs",    "capitalize", "count",     "d",          "default", "dictsort", "first",  "float",
    "int",    "items",      "join",      "last",       "length",  "list",     "lower",  "map",
    "max",    "min",        "reject",    "rejectattr", "replace", "reverse",  "round",  "safe",
    "select", "selectattr", "sort",      "string",     "sum",     "title",    "tojson", "trim",
    "unique", "upper",      "wordcount", "indent",     "format"};
const std::set<std::string> kTests = {
    "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
    "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
    "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
    "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
    "string",  "test",     "true",     "undefined",   "upper",    "==",      "!=",
    "<",       "<=",       ">",        ">="};

}  // namespace

void Ops::fail(int line, const std::string& what) const {
  throw Error(origin_ + ": line " + std::to_string(line) + ": " + what);
}

bool Ops::known_filter(const std::string& name) { return kFilters.count(name) > 0; }
bool Ops::known_test(const std::string& name) { return kTests.count(name) > 0; }

std::vector<Value> Ops::iterate(const Value& v, int line) const {
  switch (v.k) {
    case Value::K::kUndefined:
      return {};
    case Value::K::kList:
      return *v.list;
    case Value::K::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, x] : *v.dict) keys.push_back(Value::str(k));
      return keys;
    }
    case Value::K::kStr: {
      std::vector<Value> chars;
      for (const std::string& c : code_points(v.s)) chars.push_back(Value::str(c));
      return chars;
    }
    default:
      fail(line, "'" + type_name(v) + "' object is not iterable");
  }
}

Value Ops::get_attr(const Value& v, const std::string& name, int line) const {
  if (v.k == Value::K::kUndefined) fail(line, v.s);
  if (v.k == Value::K::kDict || v.k == Value::K::kNamespace) {
    if (v.k == Value::K::kDict && is_method(v, name)) return bound(v, name);
    if (const Value* x = dict_get(*v.dict, name)) return *x;
    return Value::undefined("'" + std::string(v.k == Value::K::kDict ? "dict" : "namespace") +
                            " object' has no attribute '" + name + "'");
  }
  if (is_method(v, name)) return bound(v, name);
  return Value::undefined("'" + type_name(v) + " object' has no attribute '" + name + "'");
}

Value Ops::get_item(const Value& v, const Value& key, int line) const {
  if (v.k == Value::K::kUndefined) fail(line, v.s);
  if (v.k == Value::K::kDict || v.k == Value::K::kNamespace) {
    if (key.k == Value::K::kStr) {
      if (const Value* x = dict_get(*v.dict, key.s)) return *x;
      if (v.k == Value::K::kDict && is_method(v, key.s)) return bound(v, key.s);
    }
    return Value::undefined("'dict object' has no attribute '" + to_str(key) + "'");
  }
  if ((v.k == Value::K::kList || v.k == Value::K::kStr) &&
      (key.k == Value::K::kInt || key.k == Value::K::kBool)) {
    return index(v, key.i);
  }
  if (key.k == Value::K::kStr && is_method(v, key.s)) return bound(v, key.s);
  return Value::undefined("'" + type_name(v) + " object' has no element " + repr(key));
}

Value Ops::bound(const Value& self, const std::string& name) {
  Value f = Value::function(type_name(self) + "." + name);
  f.list = std::make_shared<List>(List{self});
  return f;
}

// unique's, sort's, min's and max's key: strings compared without case (jinja's
// case_sensitive=False).
Value Ops::folded(const Value& v) {
  if (v.k != Value::K::kStr) return v;
  std::string why;
  return call_method(v, "lower", {}, {}, why);
}

// jinja's attribute paths ("function.name", "0.content"): each part looked up as an item first
// (a number as an index), then as an attribute.
Value Ops::path(const Value& item, const std::string& dotted, int line) const {
  Value x = item;
  for (size_t b = 0; b <= dotted.size();) {
    size_t e = dotted.find('.', b);
    if (e == std::string::npos) e = dotted.size();
    const std::string part = dotted.substr(b, e - b);
    const bool number = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
    x = get_item(
        x, number ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::str(part),
        line);
    b = e + 1;
  }
  return x;
}

// Filter `f` on `v` with arguments `a` (jinja's signatures; map('f', ...) calls it too).
Value Ops::apply(const std::string& f, const Value& v, const Args& a, int line) const {
  if (f == "default" || f == "d") {
    const Value* dflt = a.get(0, "default_value");
    const Value* boolean = a.get(1, "boolean");
    const bool use = v.k == Value::K::kUndefined || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dflt ? *dflt : Value::str("")) : v;
  }
  if (f == "safe") return v;
  if (f == "length" || f == "count") {
    if (v.k == Value::K::kStr) return Value::integer(static_cast<int64_t>(code_points(v.s).size()));
    if (v.k == Value::K::kUndefined) return Value::integer(0);
    if (v.k == Value::K::kList) return Value::integer(static_cast<int64_t>(v.list->size()));
    if (v.k == Value::K::kDict || v.k == Value::K::kNamespace)
      return Value::integer(static_cast<int64_t>(v.dict->size()));
    fail(line, "object of type '" + type_name(v) + "' has no len()");
  }
  if (f == "tojson") {
    if (v.k == Value::K::kUndefined) fail(line, v.s);
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    const Value* ensure_ascii = a.get(0, "ensure_ascii");
    const Value* indent = a.get(1, "indent");
    const Value* separators = a.get(2, "separators");
    const Value* sort_keys = a.get(3, "sort_keys");
    JsonStyle style;
    if (indent && indent->k != Value::K::kNone) {
      if (indent->k == Value::K::kInt || indent->k == Value::K::kBool)
        style.indent = std::string(static_cast<size_t>(std::max<int64_t>(indent->i, 0)), ' ');
      else if (indent->k == Value::K::kStr)
        style.indent = indent->s;
      style.newlines = true;
      style.item_sep = ",";
    }
    if (separators && separators->k == Value::K::kList && separators->list->size() == 2) {
      style.item_sep = to_str((*separators->list)[0]);
      style.key_sep = to_str((*separators->list)[1]);
    }
    style.sort_keys = sort_keys && truthy(*sort_keys);
    style.ensure_ascii = ensure_ascii && truthy(*ensure_ascii);
    std::string why;
    std::string out = to_json(v, style, why);
    if (!why.empty()) fail(line, why);
    return Value::str(std::move(out));
  }
  if (f == "items" || f == "dictsort") {
    if (v.k == Value::K::kUndefined) return Value::make_list({});
    if (v.k != Value::K::kDict) fail(line, f + ": '" + type_name(v) + "' is not a mapping");
    List out;
    for (const auto& [k, x] : *v.dict) out.push_back(Value::make_tuple({Value::str(k), x}));
    if (f == "dictsort") {  // dictsort(value, case_sensitive=False, by='key', reverse=False)
      const Value* cased = a.get(0, "case_sensitive");
      const Value* by = a.get(1, "by");
      const Value* rev = a.get(2, "reverse");
      const size_t at = by && to_str(*by) == "value" ? 1 : 0;
      std::string why;
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        const Value& p = (*x.list)[at];
        const Value& q = (*y.list)[at];
        return cased && truthy(*cased) ? compare("<", p, q, why)
                                       : compare("<", folded(p), folded(q), why);
      });
      if (!why.empty()) fail(line, why);
      if (rev && truthy(*rev)) std::reverse(out.begin(), out.end());
    }
    return Value::make_list(std::move(out));
  }
  std::vector<Value> items;
  if (f == "join" || f == "first" || f == "last" || f == "list" || f == "map" || f == "select" ||
      f == "reject" || f == "selectattr" || f == "rejectattr" || f == "unique" || f == "sort" ||
      f == "sum" || f == "min" || f == "max" || (f == "reverse" && v.k != Value::K::kStr))
    items = iterate(v, line);
  const Value* attribute = a.get(kNoPosition, "attribute");
  const Value* missing = a.get(kNoPosition, "default");
  auto attr_of = [&](const Value& item) {
    if (!attribute) return item;
    Value x = path(item, to_str(*attribute), line);
    return x.k == Value::K::kUndefined && missing ? *missing : x;
  };
  if (f == "join") {
    const Value* sep = a.get(0, "d");
    std::string out;
    for (size_t k = 0; k < items.size(); ++k)
      out += (k ? (sep ? to_str(*sep) : "") : "") + to_str(attr_of(items[k]));
    return Value::str(std::move(out));
  }
  if (f == "first")
    return items.empty() ? Value::undefined("no first item, sequence was empty") : items.front();
  if (f == "last")
    return items.empty() ? Value::undefined("no last item, sequence was empty") : items.back();
  if (f == "list") return Value::make_list(std::move(items));
  if (f == "reverse") {
    if (v.k == Value::K::kStr) {
      std::vector<std::string> cps = code_points(v.s);
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value::str(std::move(out));
    }
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  // sort(reverse=False, case_sensitive=False), unique/min/max(case_sensitive=False)
  const Value* cased = a.get(f == "sort" ? 1 : 0, "case_sensitive");
  auto key = [&](const Value& item) {
    const Value x = attr_of(item);
    return cased && truthy(*cased) ? x : folded(x);
  };
  if (f == "unique") {
    List out, keys;
    for (const Value& x : items) {
      const Value k = key(x);
      if (std::none_of(keys.begin(), keys.end(), [&](const Value& y) { return equal(k, y); })) {
        keys.push_back(k);
        out.push_back(x);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (f == "map") {
    List out;
    if (attribute) {
      for (const Value& x : items) out.push_back(attr_of(x));
    } else {
      if (a.pos.empty() || a.pos[0].k != Value::K::kStr)
        fail(line, "map needs a filter name or attribute=");
      const std::string sub = a.pos[0].s;
      if (!known_filter(sub)) fail(line, "no filter named '" + sub + "'");
      Args rest{std::vector<Value>(a.pos.begin() + 1, a.pos.end()), a.kw};
      for (const Value& x : items) out.push_back(apply(sub, x, rest, line));
    }
    return Value::make_list(std::move(out));
  }
  if (f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") {
    const bool by_attr = f.size() > 6;
    const bool keep_if = f[0] == 's';
    size_t at = 0;
    std::string attr;
    if (by_attr) {
      if (a.pos.empty()) fail(line, f + " needs an attribute name");
      attr = to_str(a.pos[at++]);
    }
    List out;
    for (const Value& x : items) {
      const Value subject = by_attr ? path(x, attr, line) : x;
      bool pass;
      if (at < a.pos.size()) {
        const std::string test_name = to_str(a.pos[at]);
        if (!known_test(test_name)) fail(line, "no test named '" + test_name + "'");
        pass = run_test(test_name, subject,
                        std::vector<Value>(a.pos.begin() + static_cast<long>(at) + 1, a.pos.end()),
                        line);
      } else {
        pass = truthy(subject);
      }
      if (pass == keep_if) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (f == "sort") {
    const Value* rev = a.get(0, "reverse");
    std::string why;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return compare("<", key(x), key(y), why);
    });
    if (!why.empty()) fail(line, why);
    if (rev && truthy(*rev)) std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (f == "min" || f == "max") {
    if (items.empty()) return Value::undefined("no " + f + " item, sequence was empty");
    Value best = items[0];
    std::string why;
    for (size_t k = 1; k < items.size(); ++k) {
      if (compare(f == "min" ? "<" : ">", key(items[k]), key(best), why)) best = items[k];
      if (!why.empty()) fail(line, why);
    }
    return best;
  }
  if (f == "sum") {  // sum(iterable, attribute=None, start=0)
    const Value* start = a.get(kNoPosition, "start");
    Value acc = start ? *start : Value::integer(0);
    std::string why;
    for (const Value& x : items) {
      acc = binary("+", acc, attr_of(x), why);
      if (!why.empty()) fail(line, why);
    }
    return acc;
  }
  return apply_value_filter(f, v, a, line);
}

// jinja's wordcount: the runs of word characters (letters, digits, _; other text outside ASCII
// counts as letters but for punctuation and symbols: U+0080-00BF, U+2000-2BFF, U+3000-303F,
// U+FE30-FE6F, U+FF00-FF20, U+1F000 and up).
int64_t Ops::word_count(const std::string& s) {
  int64_t words = 0;
  bool in_word = false;
  for (const std::string& c : code_points(s)) {
    const uint32_t cp = decode_cp(c);
    const bool word =
        cp < 0x80
            ? (std::isalnum(static_cast<int>(cp)) || cp == '_')
            : !((cp >= 0x80 && cp <= 0xBF) || cp == 0xD7 || cp == 0xF7 ||
                (cp >= 0x2000 && cp <= 0x2BFF) || (cp >= 0x3000 && cp <= 0x303F) ||
                (cp >= 0xFE30 && cp <= 0xFE6F) || (cp >= 0xFF00 && cp <= 0xFF20) || cp >= 0x1F000);
    if (word && !in_word) ++words;
    in_word = word;
  }
  return words;
}

// Python's int(text) and float(text) for the int and float filters: false when not a number.
bool Ops::parse_number(const std::string& text, bool integer, int64_t& i, double& f) {
  std::string s = strip(text, nullptr, true, true);
  for (size_t k = 1; k + 1 < s.size(); ++k)  // 1_000: underscores between digits
    if (s[k] == '_' && std::isdigit(static_cast<unsigned char>(s[k - 1])) &&
        std::isdigit(static_cast<unsigned char>(s[k + 1])))
      s.erase(k--, 1);
  if (s.empty() || s.find_first_of("xXpP_") != std::string::npos) return false;
  errno = 0;
  char* end = nullptr;
  if (integer) {
    i = std::strtoll(s.c_str(), &end, 10);
    if (*end == '\0' && errno == 0) return true;
  }
  errno = 0;
  f = std::strtod(s.c_str(), &end);
  if (*end != '\0' || errno == ERANGE) return false;
  if (!integer) return true;
  if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return false;
  i = static_cast<int64_t>(f);
  return true;
}

// The filters of one value and plain arguments.
Value Ops::apply_value_filter(const std::string& f, const Value& v, const Args& a, int line) const {
  auto arg = [&](size_t i, const char* name) { return a.get(i, name); };
  if (f == "title") {  // jinja's: a word starts after '-', whitespace, '(', '{', '[' or '<'
    std::string out = to_str(v);
    bool start = true;
    for (char& c : out) {
      const auto u = static_cast<unsigned char>(c);
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || is_space(c);
    }
    return Value::str(out);
  }
  if (f == "upper" || f == "lower" || f == "capitalize") {
    std::string why;
    return call_method(Value::str(to_str(v)), f, {}, {}, why);
  }
  if (f == "string") return Value::str(to_str(v));
  if (f == "trim") {
    const Value* chars = arg(0, "chars");
    return Value::str(
        strip(to_str(v), chars && chars->k == Value::K::kStr ? &chars->s : nullptr, true, true));
  }
  if (f == "abs") {
    if (!is_number(v)) fail(line, "bad operand type for abs(): '" + type_name(v) + "'");
    if (v.k == Value::K::kInt && v.i == INT64_MIN) fail(line, "integer overflow");
    return v.k == Value::K::kFloat ? Value::real(std::fabs(v.f)) : Value::integer(std::llabs(v.i));
  }
  if (f == "int" || f == "float") {  // int(value, default=0), float(value, default=0.0)
    if (v.k == Value::K::kUndefined) fail(line, v.s);
    const Value* dflt = arg(0, "default");
    const Value fallback = dflt ? *dflt : (f == "int" ? Value::integer(0) : Value::real(0));
    if (is_number(v)) {
      if (f == "float")
        return Value::real(v.k == Value::K::kFloat ? v.f : static_cast<double>(v.i));
      if (v.k != Value::K::kFloat) return Value::integer(v.i);
      if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return fallback;
      return Value::integer(static_cast<int64_t>(v.f));
    }
    int64_t i = 0;
    double x = 0;
    if (v.k != Value::K::kStr || !parse_number(v.s, f == "int", i, x)) return fallback;
    return f == "int" ? Value::integer(i) : Value::real(x);
  }
  if (f == "round") {  // round(value, precision=0, method='common')
    const Value* precision = arg(0, "precision");
    const Value* method = arg(1, "method");
    if (!is_number(v)) fail(line, "round: '" + type_name(v) + "' is not a number");
    const std::string how = method ? to_str(*method) : "common";
    if (how != "common" && how != "floor" && how != "ceil")
      fail(line, "round: method must be common, floor or ceil");
    const int64_t p = precision ? precision->i : 0;
    const double x = v.k == Value::K::kFloat ? v.f : static_cast<double>(v.i);
    const double scale = std::pow(10.0, static_cast<double>(p));
    const double y = how == "floor"  ? std::floor(x * scale)
                     : how == "ceil" ? std::ceil(x * scale)
                                     : std::nearbyint(x * scale);  // halves to even, as Python
    if (how == "common" && v.k == Value::K::kFloat && p >= 100) return v;  // all its digits
    if (how == "common" && v.k == Value::K::kFloat && p >= 0) {
      // Python rounds the float's exact decimal value, halves to even: as printf does
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(p), v.f);
      return Value::real(std::strtod(buf, nullptr));
    }
    // Python's round(int, n) is an int; floor and ceil divide, so give floats
    if (v.k != Value::K::kFloat && how == "common") {
      if (p >= 0) return Value::integer(v.i);
      if (p < -18) return Value::integer(0);
      int64_t unit = 1;  // exactly, halves to even, as Python's round(int, -n)
      for (int64_t k = 0; k < -p; ++k) unit *= 10;
      int64_t q = v.i / unit, r = v.i % unit;
      if (r < 0) {
        r += unit;
        --q;
      }
      if (2 * r > unit || (2 * r == unit && (q % 2 != 0))) ++q;
      int64_t out = 0;
      if (__builtin_mul_overflow(q, unit, &out)) fail(line, "integer overflow");
      return Value::integer(out);
    }
    return Value::real(y / scale);
  }
  if (f == "replace") {  // str(s).replace(str(old), str(new), count)
    const Value* old = arg(0, "old");
    const Value* rep = arg(1, "new");
    if (!old || !rep) fail(line, "replace(old, new) needs two arguments");
    std::vector<Value> pos{Value::str(to_str(*old)), Value::str(to_str(*rep))};
    if (const Value* count = arg(2, "count")) pos.push_back(*count);
    std::string why;
    Value out = call_method(Value::str(to_str(v)), "replace", pos, {}, why);
    if (!why.empty()) fail(line, why);
    return out;
  }
  if (f == "wordcount") return Value::integer(word_count(to_str(v)));
  if (f == "indent") {  // jinja's indent(s, width=4, first=False, blank=False)
    const Value* width = arg(0, "width");
    const Value* first_line = arg(1, "first");
    const Value* blank = arg(2, "blank");
    const std::string pad =
        !width ? std::string(4, ' ')
        : width->k == Value::K::kStr
            ? width->s
            : std::string(static_cast<size_t>(std::max<int64_t>(width->i, 0)), ' ');
    std::string why;
    const Value lines = call_method(Value::str(to_str(v) + "\n"), "splitlines", {}, {}, why);
    std::string out;
    for (size_t k = 0; k < lines.list->size(); ++k) {
      const std::string& l = (*lines.list)[k].s;
      if (k) out += "\n";
      out += (k > 0 && (!l.empty() || (blank && truthy(*blank))) ? pad : "") + l;
    }
    return Value::str(first_line && truthy(*first_line) ? pad + out : out);
  }
  if (f == "format") {  // str(value) % args
    std::string why;
    std::string out = percent_format(to_str(v), a.pos, why);
    if (!why.empty()) fail(line, "format: " + why);
    return Value::str(std::move(out));
  }
  fail(line, "the filter '" + f + "' cannot be used here");
}

bool Ops::run_test(const std::string& t, const Value& v, const std::vector<Value>& args,
                   int line) const {
  using K = Value::K;
  auto need = [&](size_t n) {
    if (args.size() < n) fail(line, "the test '" + t + "' needs an argument");
  };
  if (t == "defined") return v.k != K::kUndefined;
  if (t == "undefined") return v.k == K::kUndefined;
  if (t == "none") return v.k == K::kNone;
  if (t == "string") return v.k == K::kStr;
  if (t == "number") return is_number(v);
  if (t == "integer") return v.k == K::kInt;
  if (t == "float") return v.k == K::kFloat;
  if (t == "boolean") return v.k == K::kBool;
  if (t == "true") return v.k == K::kBool && v.b;
  if (t == "false") return v.k == K::kBool && !v.b;
  if (t == "mapping") return v.k == K::kDict;
  if (t == "iterable")
    return v.k == K::kList || v.k == K::kDict || v.k == K::kStr || v.k == K::kUndefined;
  if (t == "sequence") return v.k == K::kList || v.k == K::kDict || v.k == K::kStr;
  if (t == "callable") return v.k == K::kFunction;
  if (t == "escaped") return false;
  if (t == "lower" || t == "upper") {
    if (v.k != K::kStr) return false;
    std::string why;
    return truthy(call_method(v, t == "lower" ? "islower" : "isupper", {}, {}, why));
  }
  if (t == "odd" || t == "even" || t == "divisibleby") {
    if (v.k != K::kInt && v.k != K::kBool) fail(line, "the test '" + t + "' takes an integer");
    if (t == "divisibleby") {
      need(1);
      if (args[0].i == 0) fail(line, "integer division or modulo by zero");
      return args[0].i == -1 || v.i % args[0].i == 0;
    }
    return (((v.i % 2) + 2) % 2 == 1) == (t == "odd");
  }
  if (t == "sameas") {
    need(1);
    return v.k == args[0].k &&
           (v.k == K::kNone || v.k == K::kUndefined || (v.k == K::kBool && v.b == args[0].b));
  }
  static const std::unordered_map<std::string, std::string> kOps = {
      {"eq", "=="}, {"equalto", "=="}, {"==", "=="},      {"ne", "!="},
      {"!=", "!="}, {"lt", "<"},       {"lessthan", "<"}, {"<", "<"},
      {"le", "<="}, {"<=", "<="},      {"gt", ">"},       {"greaterthan", ">"},
      {">", ">"},   {"ge", ">="},      {">=", ">="},      {"in", "in"}};
  const auto op = kOps.find(t);
  if (op != kOps.end()) {
    need(1);
    std::string why;
    const bool r = compare(op->second, v, args[0], why);
    if (!why.empty()) fail(line, why);
    return r;
  }
  fail(line, "the test '" + t + "' is not supported by this renderer");
}

}  // namespace fabric::jinja
