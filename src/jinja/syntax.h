#pragma once
// The template's syntax tree and the parser that builds it. Expressions evaluate to a Value,
// statements append to the output; both are implemented in interp.cc. parse_template() is where
// a caller (server/chat_template.cc) starts.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace sieve::jinja {

struct Expr {
  Pos pos;
  int depth = 1;  // height of this subtree, bounded by kMaxExpressionDepth
  virtual ~Expr() = default;
  virtual Value eval(Interp& in) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

enum class Flow { kNormal, kBreak, kContinue };

struct Node {
  Pos pos;
  virtual ~Node() = default;
  virtual Flow render(Interp& in, std::string& out) const = 0;
};
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Literal : Expr {
  Value value;
  Value eval(Interp&) const override { return value; }
};

struct Name : Expr {
  std::string name;
  Value eval(Interp& in) const override;
};

struct ListLiteral : Expr {
  std::vector<ExprPtr> items;
  bool tuple = false;
  Value eval(Interp& in) const override;
};

struct DictLiteral : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Value eval(Interp& in) const override;
};

struct Attr : Expr {  // obj.name
  ExprPtr object;
  std::string name;
  Value eval(Interp& in) const override;
};

struct Subscript : Expr {  // obj[index]
  ExprPtr object, index;
  Value eval(Interp& in) const override;
};

struct Slice : Expr {                 // obj[start:stop:step]
  ExprPtr object, start, stop, step;  // each may be null
  Value eval(Interp& in) const override;
};

struct Call : Expr {
  ExprPtr callee;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value eval(Interp& in) const override;
};

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&, Pos);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&, Pos);

struct Filter : Expr {  // operand | name(args)
  ExprPtr operand;
  std::string name;
  FilterFn fn = nullptr;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  Value eval(Interp& in) const override;
};

struct Test : Expr {  // operand is [not] name(args)
  ExprPtr operand;
  TestFn fn = nullptr;
  bool negated = false;
  std::vector<ExprPtr> args;
  Value eval(Interp& in) const override;
};

struct Unary : Expr {
  char op = '-';  // '-', '+', '!' (not)
  ExprPtr operand;
  Value eval(Interp& in) const override;
};

struct Binary : Expr {
  std::string op;  // + - * / // % ** ~ and or
  ExprPtr left, right;
  Value eval(Interp& in) const override;
};

struct Compare : Expr {  // a op1 b op2 c ...
  ExprPtr first;
  std::vector<std::pair<std::string, ExprPtr>> rest;  // ops: == != < <= > >= in notin
  Value eval(Interp& in) const override;
};

struct Conditional : Expr {       // then if cond else otherwise
  ExprPtr then, cond, otherwise;  // otherwise may be null (undefined)
  Value eval(Interp& in) const override;
};

struct TextNode : Node {
  std::string text;
  Flow render(Interp& in, std::string& out) const override;
};

struct OutputNode : Node {
  ExprPtr expr;
  Flow render(Interp& in, std::string& out) const override;
};

struct IfNode : Node {
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body otherwise;
  Flow render(Interp& in, std::string& out) const override;
};

struct ForNode : Node {
  std::vector<std::string> targets;
  ExprPtr iterable;
  ExprPtr filter;  // may be null
  Body body, otherwise;
  Flow render(Interp& in, std::string& out) const override;
};

struct SetNode : Node {
  std::vector<std::string> targets;  // one name, or several to unpack into
  std::string attribute;             // set targets[0].attribute = ... (namespace)
  ExprPtr value;                     // null for a block set
  Body body;                         // {% set x %}body{% endset %}
  Flow render(Interp& in, std::string& out) const override;
};

struct MacroNode : Node {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  Flow render(Interp& in, std::string& out) const override;
};

struct FilterBlockNode : Node {    // {% filter name(args) %}body{% endfilter %}
  std::unique_ptr<Filter> filter;  // operand unset: the rendered body
  Body body;
  Flow render(Interp& in, std::string& out) const override;
};

struct LoopControlNode : Node {
  Flow flow = Flow::kBreak;
  Flow render(Interp&, std::string&) const override { return flow; }
};

struct BodyNode : Node {  // {% generation %}: transformers' assistant-mask marker, renders as is
  Body body;
  Flow render(Interp& in, std::string& out) const override;
};

// Parses a whole template (Jinja syntax, transformers' whitespace settings); throws Error naming
// line:column.
Body parse_template(std::string_view source);

}  // namespace sieve::jinja
