// The syntax tree of fabric::jinja::Template (internal to jinja*.cc): the lexer's pieces
// (text, {{ }} and {% %} tags with their tokens, Jinja's whitespace rules applied) and the
// parser's expressions and statements.
#ifndef FABRIC_DATA_JINJA_SYNTAX_H_
#define FABRIC_DATA_JINJA_SYNTAX_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "fabric/data/jinja_value.h"

namespace fabric::jinja {

inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

struct Token {
  enum class T { kName, kStr, kInt, kFloat, kOp, kEnd };
  T t = T::kEnd;
  std::string s;
  int64_t i = 0;
  double f = 0;
  int line = 1;
};

struct Piece {
  enum class K { kText, kOutput, kBlock };
  K k;
  std::string text;           // kText
  std::vector<Token> tokens;  // kOutput, kBlock (ending with a kEnd token)
  int line;
};

// `source` as pieces: newlines normalized, one trailing newline dropped, comments gone, and the
// text around tags trimmed as trim_blocks, lstrip_blocks and the tags' - and + say. Errors:
// fabric::Error "ORIGIN: line N: ..." (an unclosed tag, comment or string).
std::vector<Piece> lex(const std::string& source, const std::string& origin);

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum class T {
    kConst,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kPos,
    kNot,
    kBinary,
    kAnd,
    kOr,
    kCompare,
    kCond,
    kList,
    kTuple,
    kDict
  };
  T t = T::kConst;
  int line = 1;
  Value value;              // kConst
  std::string name;         // kName; kAttr: the attribute; kFilter, kTest: which; kBinary: op
  std::vector<ExprP> kids;  // the subject first, then arguments (null: an absent slice bound)
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // kCompare: one per pair
  bool negate = false;           // kTest: "is not"
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;
struct Node {
  enum class T { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBlock, kMacro };
  T t = T::kText;
  int line = 1;
  std::string text;
  // kOutput: the value; kIf: each branch's test; kFor: iterable, filter; kMacro: each
  // parameter's default (null: none)
  std::vector<ExprP> exprs;
  std::vector<Body> bodies;  // kIf: each branch (+ else); kFor: body, else; kSetBlock, kBlock,
                             // kMacro: the one body
  std::vector<std::string> names;  // kFor, kSet, kSetBlock: the targets; kMacro: name, params
  std::string attr;                // kSet: NAME.ATTR (a namespace's attribute)
};

// The statements of `pieces`; `names` gets every variable, attribute and constant key read.
// Errors: fabric::Error "ORIGIN: line N: ..." (a tag this renderer does not take, a syntax error).
Body parse(std::vector<Piece> pieces, const std::string& origin, std::set<std::string>& names);

}  // namespace fabric::jinja

#endif  // FABRIC_DATA_JINJA_SYNTAX_H_
