#include "fabric/config/internal/value.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>

#include "fabric/core/error.h"
#include "fabric/core/suggest.h"

namespace fabric::internal {
namespace {

bool parse_int(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  const char* begin = text.data();
  if (*begin == '+') ++begin;
  auto [end, ec] = std::from_chars(begin, text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool parse_double(const std::string& text, double* out) {
  if (text == ".inf" || text == "+.inf" || text == ".Inf") return *out = INFINITY, true;
  if (text == "-.inf" || text == "-.Inf") return *out = -INFINITY, true;
  if (text == ".nan" || text == ".NaN") return *out = NAN, true;
  if (text.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

std::string bound_text(const KeySpec& spec) {
  auto number = [&spec](double v) {
    return spec.type() == KeyType::kInt ? std::to_string(static_cast<int64_t>(v))
                                        : format_double(v);
  };
  std::string out;
  if (spec.min_bound())
    out += std::string(spec.min_inclusive() ? ">= " : "> ") + number(*spec.min_bound());
  if (spec.max_bound()) {
    if (!out.empty()) out += " and ";
    out += std::string(spec.max_inclusive() ? "<= " : "< ") + number(*spec.max_bound());
  }
  if (spec.excluded()) out += (out.empty() ? "not " : " and not ") + number(*spec.excluded());
  return out;
}

// Empty when `v` satisfies the bounds, else "must be >= 0 and < 1".
std::string check_bounds(const KeySpec& spec, double v) {
  if (std::isnan(v)) return "is not a number";
  if (std::isinf(v)) return "is not finite";
  bool ok = !spec.excluded() || v != *spec.excluded();
  if (spec.min_bound()) ok &= spec.min_inclusive() ? v >= *spec.min_bound() : v > *spec.min_bound();
  if (spec.max_bound()) ok &= spec.max_inclusive() ? v <= *spec.max_bound() : v < *spec.max_bound();
  return ok ? "" : "is out of range: must be " + bound_text(spec);
}

Normalized fail(std::string message) { return {YAML::Node(), std::move(message)}; }

Normalized ok(YAML::Node node) { return {std::move(node), ""}; }

Normalized normalize_scalar(const KeySpec& spec, const YAML::Node& value) {
  const std::string text = value.Scalar();
  switch (spec.type()) {
    case KeyType::kBool: {
      static const std::set<std::string> truthy = {"true", "True", "TRUE", "yes", "on"};
      static const std::set<std::string> falsy = {"false", "False", "FALSE", "no", "off"};
      if (truthy.count(text)) return ok(YAML::Node(true));
      if (falsy.count(text)) return ok(YAML::Node(false));
      return fail(describe(value) + " is not a boolean (true or false)");
    }
    case KeyType::kInt: {
      int64_t v = 0;
      if (spec.allows_auto() && text == "auto") return ok(YAML::Node("auto"));
      if (!parse_int(text, &v))
        return fail(describe(value) +
                    (spec.allows_auto() ? " is not an integer or auto" : " is not an integer"));
      if (auto e = check_bounds(spec, static_cast<double>(v)); !e.empty())
        return fail(text + " " + e);
      return ok(YAML::Node(v));
    }
    case KeyType::kFloat: {
      double v = 0;
      if (!parse_double(text, &v)) return fail(describe(value) + " is not a number");
      if (auto e = check_bounds(spec, v); !e.empty()) return fail(text + " " + e);
      return ok(YAML::Node(format_double(v)));
    }
    case KeyType::kString:
      return ok(YAML::Node(text));
    case KeyType::kChoice: {
      for (const auto& c : spec.choices())
        if (c == text) return ok(YAML::Node(text));
      if (auto it = spec.aliases().find(text); it != spec.aliases().end())
        return ok(YAML::Node(it->second));
      std::vector<std::string> all = spec.choices();
      for (const auto& [alias, canonical] : spec.aliases()) all.push_back(alias);
      return fail(describe(value) + " is not " + spec.noun_text() + did_you_mean(text, all) +
                  " (one of " + join(spec.choices()) + ")");
    }
    case KeyType::kDevices: {
      if (text == "auto") return ok(YAML::Node("auto"));
      int64_t n = 0;
      if (parse_int(text, &n) && (n >= 1 || n == -1)) return ok(YAML::Node(n));
      return fail(describe(value) +
                  " is not a device request: use auto, a count >= 1, -1 for all, or a list of "
                  "device ids like [0, 1]");
    }
    case KeyType::kFloatList:
      return fail(describe(value) + " is not a list: write it like [0.9, 0.999]");
    case KeyType::kChoiceList:
      return fail(describe(value) + " is not a list: write it like [" + spec.choices().front() +
                  "] (or [] for none)");
    case KeyType::kStringList:
      return fail(describe(value) + " is not a list: write it like [" + describe(value) +
                  "] (or [] for none)");
  }
  return fail("unsupported key type");
}

}  // namespace

std::string format_double(double value) {
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  if (std::isnan(value)) return ".nan";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  std::string text(buf, ec == std::errc() ? end : buf);
  // Keep floats recognisable as floats in YAML: "2" → "2.0" (but not "1e+20").
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

std::string describe(const YAML::Node& value) {
  constexpr std::size_t kMaxChars = 80;  // a value quoted in a message, not the whole file
  if (value.IsScalar()) return "'" + one_line(value.Scalar(), kMaxChars) + "'";
  YAML::Emitter out;
  out.SetSeqFormat(YAML::Flow);
  out.SetMapFormat(YAML::Flow);
  out << value;
  return one_line(out.c_str(), kMaxChars);
}

Normalized normalize_value(const KeySpec& spec, const YAML::Node& value) {
  if (!value.IsDefined() || value.IsNull())
    return fail("no value given: write a value or delete the key");
  if (value.IsMap()) {
    // What made it a mapping: braces around it, or a colon followed by a space or ending it.
    const bool braces = value.Style() == YAML::EmitterStyle::Flow;
    return fail("expected " + spec.type_name() + ", got a mapping " + describe(value) +
                (spec.type() != KeyType::kString ? ""
                 : braces ? "; YAML reads a value that starts with '{' as a mapping: quote it, "
                            "'\"{run_dir}/weights.pt\"' (in a shell: key='\"{run_dir}/...\"')"
                          : "; YAML reads a colon followed by a space, or ending the value, as a "
                            "mapping: quote the whole value, '\"def f(x):\"' (in a shell: "
                            "key='\"def f(x):\"')"));
  }
  if (value.IsSequence()) {
    if (spec.type() == KeyType::kDevices) {
      YAML::Node ids(YAML::NodeType::Sequence);
      std::set<int64_t> seen;
      for (const auto& item : value) {
        int64_t id = -1;
        if (!item.IsScalar() || !parse_int(item.Scalar(), &id) || id < 0)
          return fail("device ids must be integers >= 0, got " + describe(item));
        if (!seen.insert(id).second)
          return fail("device id " + std::to_string(id) + " is listed twice");
        ids.push_back(id);
      }
      if (ids.size() == 0)
        return fail("an empty device list selects nothing: use auto or list ids");
      ids.SetStyle(YAML::EmitterStyle::Flow);
      return ok(ids);
    }
    if (spec.type() == KeyType::kFloatList) {
      YAML::Node list(YAML::NodeType::Sequence);
      for (const auto& item : value) {
        double v = 0;
        if (!item.IsScalar() || !parse_double(item.Scalar(), &v))
          return fail("list elements must be numbers, got " + describe(item));
        if (auto e = check_bounds(spec, v); !e.empty())
          return fail("element " + item.Scalar() + " " + e);
        list.push_back(format_double(v));
      }
      list.SetStyle(YAML::EmitterStyle::Flow);
      return ok(list);
    }
    if (spec.type() == KeyType::kChoiceList) {
      YAML::Node list(YAML::NodeType::Sequence);
      std::set<std::string> seen;
      for (const auto& item : value) {
        const std::string text = item.IsScalar() ? item.Scalar() : describe(item);
        bool known = false;
        for (const auto& c : spec.choices()) known = known || c == text;
        if (!item.IsScalar() || !known)
          return fail("'" + text + "' is not " + spec.noun_text() +
                      did_you_mean(text, spec.choices()) + " (one of " + join(spec.choices()) +
                      ")");
        if (!seen.insert(text).second) return fail("'" + text + "' is listed twice");
        list.push_back(text);
      }
      list.SetStyle(YAML::EmitterStyle::Flow);
      return ok(list);
    }
    if (spec.type() == KeyType::kStringList) {
      YAML::Node list(YAML::NodeType::Sequence);
      std::set<std::string> seen;
      for (const auto& item : value) {
        if (!item.IsScalar() || item.Scalar().empty())
          return fail("list elements must be non-empty strings, got " + describe(item));
        if (!seen.insert(item.Scalar()).second)
          return fail("'" + item.Scalar() + "' is listed twice");
        list.push_back(item.Scalar());
      }
      list.SetStyle(YAML::EmitterStyle::Flow);
      return ok(list);
    }
    return fail("expected " + spec.type_name() + ", got a list " + describe(value));
  }
  return normalize_scalar(spec, value);
}

}  // namespace fabric::internal
