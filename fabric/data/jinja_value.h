// The values fabric::jinja::Template computes with (internal to jinja.cc): Python's None, bool,
// int, float, str, list and dict, a jinja2 namespace, a function, and jinja2's Undefined, with
// Python's rules for truthiness, ==, <, arithmetic, str() and repr(), and json.dumps.
#ifndef FABRIC_DATA_JINJA_VALUE_H_
#define FABRIC_DATA_JINJA_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "fabric/core/utf8.h"

namespace fabric::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // in insertion order, as Python's

struct Value {
  enum class K {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kStr,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  K k = K::kUndefined;
  bool b = false;
  int64_t i = 0;  // kInt; kBool: 0 or 1 (Python's bool is an int)
  double f = 0;
  std::string s;                // kStr; kUndefined: why it is undefined; kFunction: its name
  std::shared_ptr<List> list;   // kList; kFunction: the object a method is bound to
  std::shared_ptr<Dict> dict;   // kDict, kNamespace (shared: `set ns.x` changes it in place)
  const void* macro = nullptr;  // kFunction: a {% macro %}'s definition (its syntax-tree node)
  bool tuple = false;           // kList: a tuple (another type to ==, printed in parentheses)

  static Value undefined(std::string why);
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value real(double v);
  static Value str(std::string v);
  static Value make_list(List v);
  static Value make_tuple(List v);  // a list that prints as Python's tuple: (1, 'a'), ('a',)
  static Value make_dict(Dict v);
  static Value function(std::string name);
};

const Value* dict_get(const Dict& d, const std::string& key);
void dict_set(Dict& d, const std::string& key, Value v);
// fabric::Error for a value nested more than 100 deep or an integer past int64.
Value from_json(const nlohmann::ordered_json& j, int depth = 0);

std::string type_name(const Value& v);  // Python's: str, int, NoneType, ...
bool is_number(const Value& v);         // int, float or bool
double as_double(const Value& v);       // a number as a float
bool truthy(const Value& v);
std::string to_str(const Value& v);  // Python's str(); Undefined: ""
std::string repr(const Value& v);    // Python's repr()
bool equal(const Value& a, const Value& b);
// ==, !=, <, <=, >, >=, in, notin; `why` gets Python's TypeError for an order of unlike types.
bool compare(const std::string& op, const Value& a, const Value& b, std::string& why);
// + - * / // % ** ~; `why` gets the error (an Undefined operand, unlike types).
Value binary(const std::string& op, const Value& a, const Value& b, std::string& why);
// Python's `fmt % args`: %s %r %d %i %o %x %X %c %e %f %g with flags, width and precision.
std::string percent_format(const std::string& fmt, const List& args, std::string& why);
Value index(const Value& v, int64_t i);  // a list's or str's item (negative from the end)
Value slice(const Value& v, std::optional<int64_t> start, std::optional<int64_t> stop,
            std::optional<int64_t> step, std::string& why);

std::vector<std::string> code_points(const std::string& s);  // each as its UTF-8 bytes
uint32_t decode_cp(const std::string& c);  // one of code_points()'s (a stray byte: U+FFFD)
bool is_py_space(const std::string& c);    // Python's str.isspace() for one of them
using fabric::append_utf8;                 // fabric/core/utf8.h
// Python's str.strip/lstrip/rstrip: `chars` (null: whitespace, Unicode's included).
std::string strip(const std::string& s, const std::string* chars, bool left, bool right);

bool is_method(const Value& self, const std::string& name);  // str's and dict's methods
Value call_method(const Value& self, const std::string& name, const std::vector<Value>& pos,
                  const std::vector<std::pair<std::string, Value>>& kw, std::string& why);

// json.dumps's options as transformers' tojson passes them.
struct JsonStyle {
  std::string indent;     // with `newlines`: each level's indent
  bool newlines = false;  // indent given (even 0 or "")
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false, ensure_ascii = false;
};
std::string to_json(const Value& v, const JsonStyle& style, std::string& why);

}  // namespace fabric::jinja

#endif  // FABRIC_DATA_JINJA_VALUE_H_
