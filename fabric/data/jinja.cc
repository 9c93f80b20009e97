// The Jinja2 subset of jinja.h: a lexer that applies Jinja's whitespace rules as transformers
// configures them (trim_blocks, lstrip_blocks, one trailing newline dropped), a recursive-descent
// parser with Jinja's operator precedence, and a tree walker whose values behave as Python's
// (truthiness, ==, printing, json.dumps) and as jinja2's Undefined (prints "", iterates empty,
// fails on attribute access and arithmetic).
#include "fabric/data/jinja.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>
#include "fabric/core/error.h"
#include "fabric/core/utf8.h"
#include "fabric/data/jinja_ops.h"
#include "fabric/data/jinja_syntax.h"
#include "fabric/data/jinja_value.h"

namespace fabric::jinja {

struct Template::Impl {
  std::string origin;
  Body body;
  std::set<std::string> names;
};

namespace {

// ---- rendering --------------------------------------------------------------------------------

class Renderer : private Ops {
 public:
  Renderer(const Template::Impl& t, const nlohmann::ordered_json& context) : Ops(t.origin), t_(t) {
    frames_.emplace_back();
    for (const char* g : {"raise_exception", "strftime_now", "namespace", "range", "dict"})
      frames_.back()[g] = Value::function(g);
    if (context.is_object())
      for (const auto& item : context.items()) {
        try {
          frames_.back()[item.key()] = from_json(item.value());
        } catch (const Error& e) {
          throw Error(t.origin + ": " + item.key() + ": " + e.what());
        }
      }
  }

  std::string run() {
    std::string out;
    exec(t_.body, out);
    return out;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // A name in the frames from floor_ up, else in the template's own (a macro sees its arguments
  // and the template's variables, not its caller's).
  Value lookup(const std::string& name) const {
    for (size_t k = frames_.size(); k-- > 0;) {
      if (k < floor_ && k > 0) continue;
      const auto it = frames_[k].find(name);
      if (it != frames_[k].end()) return it->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  Value call_macro(const Node& m, const Expr& call) {
    const size_t params = m.names.size() - 1;
    if (call.kids.size() - 1 > params)
      fail(call.line, "macro '" + m.names[0] + "' takes not more than " + std::to_string(params) +
                          " argument(s)");
    std::unordered_map<std::string, Value> frame;
    for (size_t k = 1; k < call.kids.size(); ++k) frame[m.names[k]] = eval(*call.kids[k]);
    for (const auto& [key, x] : call.kwargs) {
      const auto p = std::find(m.names.begin() + 1, m.names.end(), key);
      if (p == m.names.end())
        fail(call.line, "macro '" + m.names[0] + "' takes no keyword argument '" + key + "'");
      frame[key] = eval(*x);
    }
    if (macro_depth_ >= kMaxMacroDepth)
      fail(call.line, "macro '" + m.names[0] + "' called " + std::to_string(kMaxMacroDepth) +
                          " deep (endless recursion?)");
    ++macro_depth_;
    const size_t saved = floor_;
    frames_.push_back(std::move(frame));
    floor_ = frames_.size() - 1;
    for (size_t k = 0; k < params; ++k) {  // defaults, evaluated where the arguments are seen
      if (frames_.back().count(m.names[k + 1])) continue;
      frames_.back()[m.names[k + 1]] =
          m.exprs[k] ? eval(*m.exprs[k])
                     : Value::undefined("'" + m.names[k + 1] + "' is undefined");
    }
    std::string out;
    try {
      exec(m.bodies[0], out);
    } catch (...) {
      frames_.pop_back();
      floor_ = saved;
      --macro_depth_;
      throw;
    }
    frames_.pop_back();
    floor_ = saved;
    --macro_depth_;
    return Value::str(std::move(out));
  }

  Flow exec(const Body& body, std::string& out) {
    for (const auto& n : body) {
      const Flow flow = exec(*n, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, std::string& out) {
    switch (n.t) {
      case Node::T::kText:
        out += n.text;
        return Flow::kNormal;
      case Node::T::kOutput:
        out += to_str(eval(*n.exprs[0]));
        return Flow::kNormal;
      case Node::T::kIf:
        for (size_t b = 0; b < n.bodies.size(); ++b)
          if (b >= n.exprs.size() || truthy(eval(*n.exprs[b]))) return exec(n.bodies[b], out);
        return Flow::kNormal;
      case Node::T::kFor:
        return exec_for(n, out);
      case Node::T::kSet:
        assign(n, eval(*n.exprs[0]));
        return Flow::kNormal;
      case Node::T::kSetBlock: {  // its body has its own scope, as in jinja
        std::string text;
        frames_.emplace_back();
        exec(n.bodies[0], text);
        frames_.pop_back();
        assign(n, Value::str(std::move(text)));
        return Flow::kNormal;
      }
      case Node::T::kBreak:
        return Flow::kBreak;
      case Node::T::kContinue:
        return Flow::kContinue;
      case Node::T::kBlock: {  // {% generation %}: its own scope, as in jinja
        frames_.emplace_back();
        const Flow flow = exec(n.bodies[0], out);
        frames_.pop_back();
        return flow;
      }
      case Node::T::kMacro: {
        Value f = Value::function(n.names[0]);
        f.macro = &n;
        frames_.back()[n.names[0]] = f;
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  void assign(const Node& n, const Value& v) {
    if (!n.attr.empty()) {
      Value ns = lookup(n.names[0]);
      if (ns.k != Value::K::kNamespace)
        fail(n.line, "set " + n.names[0] + "." + n.attr + ": " + n.names[0] +
                         " is not a namespace() (only a namespace's attributes can be set)");
      dict_set(*ns.dict, n.attr, v);
      return;
    }
    if (n.names.size() == 1) {
      frames_.back()[n.names[0]] = v;
      return;
    }
    const std::vector<Value> items = iterate(v, n.line);
    if (items.size() != n.names.size())
      fail(n.line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                       std::to_string(n.names.size()) + " names");
    for (size_t i = 0; i < items.size(); ++i) frames_.back()[n.names[i]] = items[i];
  }

  Flow exec_for(const Node& n, std::string& out) {
    std::vector<Value> items = iterate(eval(*n.exprs[0]), n.line);
    auto bind = [&](std::unordered_map<std::string, Value>& frame, const Value& item) {
      if (n.names.size() == 1) {
        frame[n.names[0]] = item;
        return;
      }
      const std::vector<Value> parts = iterate(item, n.line);
      if (parts.size() != n.names.size())
        fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                         std::to_string(n.names.size()) + " loop variables");
      for (size_t i = 0; i < parts.size(); ++i) frame[n.names[i]] = parts[i];
    };
    if (n.exprs.size() > 1) {  // for x in xs if cond: the items the test keeps
      std::vector<Value> kept;
      for (const Value& item : items) {
        frames_.emplace_back();
        bind(frames_.back(), item);
        const bool keep = truthy(eval(*n.exprs[1]));
        frames_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      // the else branch is in the enclosing loop: a break there breaks that loop
      return n.bodies.size() > 1 ? exec(n.bodies[1], out) : Flow::kNormal;
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      Dict loop;
      dict_set(loop, "index", Value::integer(i + 1));
      dict_set(loop, "index0", Value::integer(i));
      dict_set(loop, "revindex", Value::integer(length - i));
      dict_set(loop, "revindex0", Value::integer(length - i - 1));
      dict_set(loop, "first", Value::boolean(i == 0));
      dict_set(loop, "last", Value::boolean(i == length - 1));
      dict_set(loop, "length", Value::integer(length));
      dict_set(loop, "depth", Value::integer(1));
      dict_set(loop, "depth0", Value::integer(0));
      dict_set(loop, "previtem",
               i > 0 ? items[static_cast<size_t>(i - 1)]
                     : Value::undefined("there is no previous item"));
      dict_set(loop, "nextitem",
               i + 1 < length ? items[static_cast<size_t>(i + 1)]
                              : Value::undefined("there is no next item"));
      Value cycle = Value::function("loop.cycle");
      cycle.list = std::make_shared<List>(List{Value::integer(i)});
      dict_set(loop, "cycle", cycle);
      frames_.emplace_back();
      frames_.back()["loop"] = Value::make_dict(std::move(loop));
      bind(frames_.back(), items[static_cast<size_t>(i)]);
      const Flow flow = exec(n.bodies[0], out);
      frames_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value eval(const Expr& e) {
    switch (e.t) {
      case Expr::T::kConst:
        return e.value;
      case Expr::T::kName:
        return lookup(e.name);
      case Expr::T::kAttr:
        return get_attr(eval(*e.kids[0]), e.name, e.line);
      case Expr::T::kItem:
        return get_item(eval(*e.kids[0]), eval(*e.kids[1]), e.line);
      case Expr::T::kSlice: {
        const Value v = eval(*e.kids[0]);
        std::optional<int64_t> b[3];
        for (int k = 0; k < 3; ++k)
          if (e.kids[static_cast<size_t>(k + 1)]) {
            const Value x = eval(*e.kids[static_cast<size_t>(k + 1)]);
            if (x.k == Value::K::kNone) continue;
            if (x.k != Value::K::kInt && x.k != Value::K::kBool)
              fail(e.line, "slice indices must be integers or none");
            b[k] = x.i;
          }
        if (v.k == Value::K::kUndefined) fail(e.line, v.s);
        std::string why;
        Value out = slice(v, b[0], b[1], b[2], why);
        if (!why.empty()) fail(e.line, why);
        return out;
      }
      case Expr::T::kCall:
        return call(e);
      case Expr::T::kFilter:
        return filter(e);
      case Expr::T::kTest: {
        const bool r = test(e);
        return Value::boolean(e.negate ? !r : r);
      }
      case Expr::T::kNeg:
      case Expr::T::kPos: {
        const Value v = eval(*e.kids[0]);
        if (v.k == Value::K::kUndefined) fail(e.line, v.s);
        if (!is_number(v))
          fail(e.line, "bad operand type for unary " +
                           std::string(e.t == Expr::T::kNeg ? "-" : "+") + ": '" + type_name(v) +
                           "'");
        if (e.t == Expr::T::kPos) return v.k == Value::K::kBool ? Value::integer(v.i) : v;
        return v.k == Value::K::kFloat ? Value::real(-v.f) : Value::integer(-v.i);
      }
      case Expr::T::kNot:
        return Value::boolean(!truthy(eval(*e.kids[0])));
      case Expr::T::kAnd: {
        Value l = eval(*e.kids[0]);
        return truthy(l) ? eval(*e.kids[1]) : l;
      }
      case Expr::T::kOr: {
        Value l = eval(*e.kids[0]);
        return truthy(l) ? l : eval(*e.kids[1]);
      }
      case Expr::T::kBinary: {
        std::string why;
        Value out = binary(e.name, eval(*e.kids[0]), eval(*e.kids[1]), why);
        if (!why.empty()) fail(e.line, why);
        return out;
      }
      case Expr::T::kCompare: {
        Value l = eval(*e.kids[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.kids[k + 1]);
          std::string why;
          const bool ok = compare(e.ops[k], l, r, why);
          if (!why.empty()) fail(e.line, why);
          if (!ok) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case Expr::T::kCond:
        if (truthy(eval(*e.kids[1]))) return eval(*e.kids[0]);
        if (e.kids[2]) return eval(*e.kids[2]);
        return Value::undefined("the inline if's test was false and it has no else");
      case Expr::T::kList:
      case Expr::T::kTuple: {
        List items;
        for (const auto& k : e.kids) items.push_back(eval(*k));
        return e.t == Expr::T::kTuple ? Value::make_tuple(std::move(items))
                                      : Value::make_list(std::move(items));
      }
      case Expr::T::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
          const Value key = eval(*e.kids[k]);
          if (key.k != Value::K::kStr) fail(e.line, "dict keys must be strings here");
          dict_set(d, key.s, eval(*e.kids[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
    }
    return Value::none();
  }

  Args args_of(const Expr& e, size_t first) {
    Args a;
    for (size_t k = first; k < e.kids.size(); ++k) a.pos.push_back(eval(*e.kids[k]));
    for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value call(const Expr& e) {
    const Value f = eval(*e.kids[0]);
    if (f.k == Value::K::kUndefined) fail(e.line, f.s);
    if (f.k != Value::K::kFunction) fail(e.line, "'" + type_name(f) + "' object is not callable");
    if (f.macro != nullptr) return call_macro(*static_cast<const Node*>(f.macro), e);
    const Args a = args_of(e, 1);
    const std::string& name = f.s;
    if (name == "raise_exception") {
      const Value* m = a.get(0, "message");
      fail(e.line, "the template raised: " + (m ? to_str(*m) : std::string()));
    }
    if (name == "strftime_now") {
      const Value* fmt = a.get(0, "format");
      if (!fmt || fmt->k != Value::K::kStr) fail(e.line, "strftime_now(format) takes a string");
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
      return Value::str(std::string(buf, n));
    }
    if (name == "namespace" || name == "dict") {
      Dict d;
      for (const Value& p : a.pos) {
        if (p.k != Value::K::kDict) fail(e.line, name + "() takes a dict or keyword arguments");
        for (const auto& [k, v] : *p.dict) dict_set(d, k, v);
      }
      for (const auto& [k, v] : a.kw) dict_set(d, k, v);
      Value out = Value::make_dict(std::move(d));
      if (name == "namespace") out.k = Value::K::kNamespace;
      return out;
    }
    if (name == "range") {
      std::vector<int64_t> n;
      for (const Value& p : a.pos) {
        if (p.k != Value::K::kInt && p.k != Value::K::kBool) fail(e.line, "range() takes integers");
        n.push_back(p.i);
      }
      if (n.empty() || n.size() > 3) fail(e.line, "range() takes 1 to 3 integers");
      const int64_t start = n.size() > 1 ? n[0] : 0, stop = n.size() > 1 ? n[1] : n[0];
      const int64_t step = n.size() > 2 ? n[2] : 1;
      if (step == 0) fail(e.line, "range() step must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value::integer(i));
        if (out.size() > 100000)  // the sandbox's MAX_RANGE
          fail(e.line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
      }
      return Value::make_list(std::move(out));
    }
    if (name == "loop.cycle") {
      if (a.pos.empty()) fail(e.line, "loop.cycle() needs at least one value");
      return a.pos[static_cast<size_t>((*f.list)[0].i) % a.pos.size()];
    }
    std::string why;
    Value out = call_method((*f.list)[0], name.substr(name.find('.') + 1), a.pos, a.kw, why);
    if (!why.empty()) fail(e.line, why);
    return out;
  }

  Value filter(const Expr& e) {
    if (!known_filter(e.name)) fail(e.line, "no filter named '" + e.name + "'");
    const Value v = eval(*e.kids[0]);
    return apply(e.name, v, args_of(e, 1), e.line);
  }

  bool test(const Expr& e) {
    if (!known_test(e.name)) fail(e.line, "no test named '" + e.name + "'");
    const Value v = eval(*e.kids[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.kids.size(); ++k) args.push_back(eval(*e.kids[k]));
    return run_test(e.name, v, args, e.line);
  }

  const Template::Impl& t_;
  std::vector<std::unordered_map<std::string, Value>> frames_;
  size_t floor_ = 0;
  static constexpr int kMaxMacroDepth = 100;
  int macro_depth_ = 0;  // inside a macro: its frame (lookups skip the frames between it and 0)
};

}  // namespace

Template::Template(const std::string& source, std::string origin)
    : impl_(std::make_unique<Impl>()) {
  impl_->origin = std::move(origin);
  if (const size_t bad = first_invalid_utf8(source); bad != std::string::npos)
    throw Error(impl_->origin + ": line " +
                std::to_string(
                    1 + std::count(source.begin(), source.begin() + static_cast<long>(bad), '\n')) +
                ": not UTF-8 text (byte " + std::to_string(bad) + ")");
  impl_->body = parse(lex(source, impl_->origin), impl_->origin, impl_->names);
}

Template::~Template() = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  Renderer r(*impl_, context);
  return r.run();
}

bool Template::mentions(const std::string& name) const { return impl_->names.count(name) > 0; }

}  // namespace fabric::jinja
