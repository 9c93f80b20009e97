// What fabric::jinja's values do in a template (internal to jinja*.cc): attribute and item
// access, iteration, jinja's filters and tests, each error naming the template and its line.
// The renderer (jinja.cc) walks the statements and expressions; this (jinja_filters.cc) is what
// it applies to the values they give.
#ifndef FABRIC_DATA_JINJA_OPS_H_
#define FABRIC_DATA_JINJA_OPS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "fabric/data/jinja_value.h"

namespace fabric::jinja {

class Ops {
 public:
  explicit Ops(const std::string& origin) : origin_(origin) {}

  // fabric::Error "ORIGIN: line N: what".
  [[noreturn]] void fail(int line, const std::string& what) const;

  static bool known_filter(const std::string& name);
  static bool known_test(const std::string& name);

  // A call's arguments: positional, then by keyword.
  static constexpr size_t kNoPosition = static_cast<size_t>(-1);  // a keyword-only argument
  struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    const Value* get(size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : kw)
        if (k == name) return &v;
      return nullptr;
    }
  };

  std::vector<Value> iterate(const Value& v, int line) const;
  Value get_attr(const Value& v, const std::string& name, int line) const;
  Value get_item(const Value& v, const Value& key, int line) const;
  // Filter `f` on `v` with arguments `a` (jinja's signatures; map('f', ...) calls it too).
  Value apply(const std::string& f, const Value& v, const Args& a, int line) const;
  bool run_test(const std::string& t, const Value& v, const std::vector<Value>& args,
                int line) const;

 private:
  static Value bound(const Value& self, const std::string& name);
  static Value folded(const Value& v);
  Value path(const Value& item, const std::string& dotted, int line) const;
  static int64_t word_count(const std::string& s);
  static bool parse_number(const std::string& text, bool integer, int64_t& i, double& f);
  Value apply_value_filter(const std::string& f, const Value& v, const Args& a, int line) const;

  const std::string& origin_;
};

}  // namespace fabric::jinja

#endif  // FABRIC_DATA_JINJA_OPS_H_
