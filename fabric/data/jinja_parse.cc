// A recursive-descent parser with Jinja's operator precedence (jinja_syntax.h).
#include "fabric/core/error.h"
#include "fabric/data/jinja_syntax.h"

namespace fabric::jinja {
namespace {

class Parser {
 public:
  Parser(std::vector<Piece> pieces, const std::string& origin, std::set<std::string>& names)
      : pieces_(std::move(pieces)), origin_(origin), names_(names) {}

  Body parse() {
    std::string end;
    Body body = parse_body({}, end);
    return body;
  }

 private:
  [[noreturn]] void fail(int line, const std::string& what) const {
    throw Error(origin_ + ": line " + std::to_string(line) + ": " + what);
  }

  // Pieces up to a block tag named in `ends` (its name into `end`; "" at the template's end).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Nest nest(*this, at_ < pieces_.size() ? pieces_[at_].line : 1);
    Body body;
    while (at_ < pieces_.size()) {
      Piece& p = pieces_[at_++];
      if (p.k == Piece::K::kText) {
        auto n = std::make_unique<Node>();
        n->t = Node::T::kText;
        n->line = p.line;
        n->text = p.text;
        body.push_back(std::move(n));
        continue;
      }
      toks_ = &p.tokens;
      tok_ = 0;
      if (p.k == Piece::K::kOutput) {
        auto n = std::make_unique<Node>();
        n->t = Node::T::kOutput;
        n->line = p.line;
        n->exprs.push_back(parse_tuple(true));
        expect_end();
        body.push_back(std::move(n));
        continue;
      }
      const Token& first = cur();
      if (first.t != Token::T::kName) fail(p.line, "a block tag {% %} needs a statement name");
      const std::string word = first.s;
      if (ends.count(word)) {
        end = word;
        ++tok_;
        return body;
      }
      body.push_back(parse_statement(p.line));
    }
    if (!ends.empty())
      fail(pieces_.empty() ? 1 : pieces_.back().line,
           "the template ends inside a block; close it with {% " + *ends.rbegin() + " %}");
    return body;
  }

  std::unique_ptr<Node> parse_statement(int line) {
    const std::string word = next().s;
    auto n = std::make_unique<Node>();
    n->line = line;
    std::string end;
    if (word == "if") {
      n->t = Node::T::kIf;
      n->exprs.push_back(parse_tuple(true));
      expect_end();
      while (true) {
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, end));
        if (end == "elif") {
          n->exprs.push_back(parse_tuple(true));
          expect_end();
        } else if (end == "else") {
          expect_end();
          n->bodies.push_back(parse_body({"endif"}, end));
          expect_end();
          break;
        } else {
          expect_end();
          break;
        }
      }
    } else if (word == "for") {
      n->t = Node::T::kFor;
      do {
        n->names.push_back(name_token("a loop variable"));
      } while (skip_op(","));
      if (!(cur().t == Token::T::kName && cur().s == "in"))
        fail(cur().line, "expected 'in' after the loop variables of {% for %}");
      ++tok_;
      n->exprs.push_back(parse_tuple(false));
      if (cur().t == Token::T::kName && cur().s == "if") {
        ++tok_;
        n->exprs.push_back(parse_expression(true));
      }
      if (cur().t == Token::T::kName && cur().s == "recursive")
        fail(cur().line, "recursive loops are not supported by this renderer");
      expect_end();
      ++loops_;
      n->bodies.push_back(parse_body({"else", "endfor"}, end));
      --loops_;
      expect_end();
      if (end == "else") {
        n->bodies.push_back(parse_body({"endfor"}, end));
        expect_end();
      }
    } else if (word == "set") {
      n->names.push_back(name_token("a variable name"));
      if (skip_op(".")) {
        n->attr = name_token("an attribute name");
      } else {
        while (skip_op(",")) n->names.push_back(name_token("a variable name"));
      }
      if (skip_op("=")) {
        n->t = Node::T::kSet;
        n->exprs.push_back(parse_tuple(true));
        expect_end();
      } else {
        if (!n->attr.empty() || n->names.size() != 1)
          fail(line, "a {% set %} block assigns one plain variable");
        n->t = Node::T::kSetBlock;
        expect_end();
        n->bodies.push_back(parse_body({"endset"}, end));
        expect_end();
      }
    } else if (word == "break" || word == "continue") {
      n->t = word == "break" ? Node::T::kBreak : Node::T::kContinue;
      if (loops_ == 0) fail(line, "{% " + word + " %} outside a loop");
      expect_end();
    } else if (word == "generation") {
      n->t = Node::T::kBlock;
      expect_end();
      n->bodies.push_back(parse_body({"endgeneration"}, end));
      expect_end();
    } else if (word == "macro") {
      n->t = Node::T::kMacro;
      n->names.push_back(name_token("the macro's name"));
      expect_op("(");
      while (!is_op(")")) {
        n->names.push_back(name_token("a parameter name"));
        n->exprs.push_back(skip_op("=") ? parse_expression(true) : nullptr);
        if (!skip_op(",")) break;
      }
      expect_op(")");
      expect_end();
      const int loops = loops_;  // a loop around the definition is not the body's
      loops_ = 0;
      n->bodies.push_back(parse_body({"endmacro"}, end));
      loops_ = loops;
      if (cur().t == Token::T::kName) ++tok_;  // {% endmacro name %}
      expect_end();
    } else if (word == "elif" || word == "else" || word.rfind("end", 0) == 0) {
      fail(line, "{% " + word + " %} without the block it closes");
    } else {
      fail(line, "{% " + word +
                     " %} is not supported by this renderer (it takes if, for, set, macro, " +
                     "break, continue and generation)");
    }
    return n;
  }

  const Token& cur() const { return (*toks_)[tok_]; }
  const Token& next() {
    const Token& t = (*toks_)[tok_];
    if (t.t != Token::T::kEnd) ++tok_;
    return t;
  }
  bool is_op(const char* op) const { return cur().t == Token::T::kOp && cur().s == op; }
  bool is_name(const char* name) const { return cur().t == Token::T::kName && cur().s == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++tok_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op))
      fail(cur().line, std::string("expected '") + op + "', found " + describe(cur()));
  }
  void expect_end() {
    if (cur().t != Token::T::kEnd) fail(cur().line, "unexpected " + describe(cur()) + " in a tag");
  }
  std::string name_token(const char* what) {
    if (cur().t != Token::T::kName)
      fail(cur().line, std::string("expected ") + what + ", found " + describe(cur()));
    names_.insert(cur().s);
    return next().s;
  }
  static std::string describe(const Token& t) {
    switch (t.t) {
      case Token::T::kEnd:
        return "the end of the tag";
      case Token::T::kStr:
        return "a string";
      case Token::T::kInt:
      case Token::T::kFloat:
        return "a number";
      default:
        return "'" + t.s + "'";
    }
  }

  ExprP make(Expr::T t, int line) {
    auto e = std::make_unique<Expr>();
    e->t = t;
    e->line = line;
    return e;
  }

  // Comma-separated expressions: one, or a tuple.
  ExprP parse_tuple(bool with_cond) {
    const int line = cur().line;
    ExprP first = parse_expression(with_cond);
    if (!is_op(",")) return first;
    ExprP t = make(Expr::T::kTuple, line);
    t->kids.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().t == Token::T::kEnd || is_op(")")) break;
      t->kids.push_back(parse_expression(with_cond));
    }
    return t;
  }

  ExprP parse_expression(bool with_cond) {
    Nest nest(*this, cur().line);
    ExprP e = parse_or();
    while (with_cond && is_name("if")) {
      const int line = cur().line;
      ++tok_;
      ExprP c = make(Expr::T::kCond, line);
      ExprP test = parse_or();
      ExprP other;
      if (is_name("else")) {
        ++tok_;
        other = parse_expression(true);
      }
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(test));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      ExprP o = make(Expr::T::kOr, cur().line);
      ++tok_;
      o->kids.push_back(std::move(e));
      o->kids.push_back(parse_and());
      e = std::move(o);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      ExprP o = make(Expr::T::kAnd, cur().line);
      ++tok_;
      o->kids.push_back(std::move(e));
      o->kids.push_back(parse_not());
      e = std::move(o);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      Nest nest(*this, cur().line);
      ExprP o = make(Expr::T::kNot, cur().line);
      ++tok_;
      o->kids.push_back(parse_not());
      return o;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const int line = cur().line;
    ExprP first = parse_math1();
    ExprP c;
    while (true) {
      std::string op;
      if (cur().t == Token::T::kOp && (cur().s == "==" || cur().s == "!=" || cur().s == "<" ||
                                       cur().s == ">" || cur().s == "<=" || cur().s == ">=")) {
        op = next().s;
      } else if (is_name("in")) {
        ++tok_;
        op = "in";
      } else if (is_name("not") && (*toks_)[tok_ + 1].t == Token::T::kName &&
                 (*toks_)[tok_ + 1].s == "in") {
        tok_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!c) {
        c = make(Expr::T::kCompare, line);
        c->kids.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->kids.push_back(parse_math1());
    }
    return c ? std::move(c) : std::move(first);
  }
  ExprP binary(const std::string& op, ExprP l, ExprP r, int line) {
    ExprP b = make(Expr::T::kBinary, line);
    b->name = op;
    b->kids.push_back(std::move(l));
    b->kids.push_back(std::move(r));
    return b;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = binary(t.s, std::move(e), parse_concat(), t.line);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      e = binary("~", std::move(e), parse_math2(), t.line);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = binary(t.s, std::move(e), parse_pow(), t.line);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      e = binary("**", std::move(e), parse_unary(true), t.line);
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      Nest nest(*this, cur().line);
      const Token& t = next();
      e = make(t.s == "-" ? Expr::T::kNeg : Expr::T::kPos, t.line);
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }
  ExprP parse_primary() {
    const Token t = cur();
    if (t.t == Token::T::kName) {
      ++tok_;
      if (t.s == "true" || t.s == "True" || t.s == "false" || t.s == "False") {
        ExprP c = make(Expr::T::kConst, t.line);
        c->value = Value::boolean(t.s[0] == 't' || t.s[0] == 'T');
        return c;
      }
      if (t.s == "none" || t.s == "None") {
        ExprP c = make(Expr::T::kConst, t.line);
        c->value = Value::none();
        return c;
      }
      ExprP n = make(Expr::T::kName, t.line);
      n->name = t.s;
      names_.insert(t.s);
      return n;
    }
    if (t.t == Token::T::kStr) {
      std::string s;
      while (cur().t == Token::T::kStr) s += next().s;  // adjacent literals join
      ExprP c = make(Expr::T::kConst, t.line);
      c->value = Value::str(std::move(s));
      return c;
    }
    if (t.t == Token::T::kInt || t.t == Token::T::kFloat) {
      ++tok_;
      ExprP c = make(Expr::T::kConst, t.line);
      c->value = t.t == Token::T::kInt ? Value::integer(t.i) : Value::real(t.f);
      return c;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::T::kTuple, t.line);
      ExprP first = parse_expression(true);
      if (skip_op(")")) return first;
      ExprP tuple = make(Expr::T::kTuple, t.line);
      tuple->kids.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        tuple->kids.push_back(parse_expression(true));
      }
      expect_op(")");
      return tuple;
    }
    if (skip_op("[")) {
      ExprP list = make(Expr::T::kList, t.line);
      while (!is_op("]")) {
        list->kids.push_back(parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_op("]");
      return list;
    }
    if (skip_op("{")) {
      ExprP dict = make(Expr::T::kDict, t.line);
      while (!is_op("}")) {
        dict->kids.push_back(parse_expression(true));
        expect_op(":");
        dict->kids.push_back(parse_expression(true));
        if (!skip_op(",")) break;
      }
      expect_op("}");
      return dict;
    }
    fail(t.line, "expected a value, found " + describe(t));
  }
  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        const int line = next().line;
        if (cur().t == Token::T::kName) {
          ExprP a = make(Expr::T::kAttr, line);
          a->name = next().s;
          names_.insert(a->name);
          a->kids.push_back(std::move(e));
          e = std::move(a);
        } else if (cur().t == Token::T::kInt) {
          ExprP i = make(Expr::T::kItem, line);
          ExprP c = make(Expr::T::kConst, line);
          c->value = Value::integer(next().i);
          i->kids.push_back(std::move(e));
          i->kids.push_back(std::move(c));
          e = std::move(i);
        } else {
          fail(line, "expected an attribute name after '.'");
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }
  ExprP parse_subscript(ExprP e) {
    const int line = next().line;  // '['
    ExprP bounds[3];
    bool slice = false;
    if (!is_op(":")) bounds[0] = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op(":") && !is_op("]")) bounds[1] = parse_expression(true);
      if (skip_op(":") && !is_op("]")) bounds[2] = parse_expression(true);
    }
    expect_op("]");
    ExprP s = make(slice ? Expr::T::kSlice : Expr::T::kItem, line);
    s->kids.push_back(std::move(e));
    if (slice) {
      for (auto& b : bounds) s->kids.push_back(std::move(b));
    } else {
      if (bounds[0] && bounds[0]->t == Expr::T::kConst && bounds[0]->value.k == Value::K::kStr)
        names_.insert(bounds[0]->value.s);
      s->kids.push_back(std::move(bounds[0]));
    }
    return s;
  }
  // "(args, name=value)" after `e` into `call` (a kCall, kFilter or kTest).
  void parse_args(Expr& call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().t == Token::T::kName && (*toks_)[tok_ + 1].t == Token::T::kOp &&
          (*toks_)[tok_ + 1].s == "=") {
        const std::string key = next().s;
        ++tok_;
        call.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (is_op("*") || is_op("**")) fail(cur().line, "*args and **kwargs are not supported");
        call.kids.push_back(parse_expression(true));
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
  }
  ExprP parse_call(ExprP e) {
    ExprP c = make(Expr::T::kCall, cur().line);
    c->kids.push_back(std::move(e));
    parse_args(*c);
    return c;
  }
  ExprP parse_filters(ExprP e) {
    while (true) {
      if (is_op("|")) {
        const int line = next().line;
        ExprP f = make(Expr::T::kFilter, line);
        f->name = name_token("a filter name");
        f->kids.push_back(std::move(e));
        if (is_op("(")) parse_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        const int line = next().line;
        ExprP t = make(Expr::T::kTest, line);
        if (is_name("not")) {
          ++tok_;
          t->negate = true;
        }
        if (cur().t == Token::T::kName || cur().t == Token::T::kOp) {
          t->name = next().s;
        } else {
          fail(line, "expected a test name after 'is'");
        }
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          parse_args(*t);
        } else if ((cur().t == Token::T::kName || cur().t == Token::T::kStr ||
                    cur().t == Token::T::kInt || cur().t == Token::T::kFloat || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail(cur().line, "tests cannot be chained with 'is'");
          t->kids.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Piece> pieces_;
  const std::string& origin_;
  std::set<std::string>& names_;
  size_t at_ = 0;
  int loops_ = 0;  // for bodies the parser is in (break and continue need one)
  // Blocks, brackets and unary operators nested deeper than kMaxDepth are refused: the parser
  // and the renderer recurse once a level, and a thread's stack has room for a few thousand.
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;
  struct Nest {
    Parser& p;
    Nest(Parser& parser, int line) : p(parser) {
      if (++p.depth_ > kMaxDepth)
        p.fail(line, "nested more than " + std::to_string(kMaxDepth) + " deep");
    }
    ~Nest() { --p.depth_; }
  };
  const std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
};

}  // namespace

Body parse(std::vector<Piece> pieces, const std::string& origin, std::set<std::string>& names) {
  return Parser(std::move(pieces), origin, names).parse();
}

}  // namespace fabric::jinja
