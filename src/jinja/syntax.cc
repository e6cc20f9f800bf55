#include "jinja/syntax.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "jinja/builtins.h"
#include "jinja/lexer.h"

namespace sieve::jinja {
namespace {

// Nesting bounds checked while parsing, so that evaluation (recursive over the AST) stays within
// a small, fixed stack budget per macro call: (statements + expression depth) * max_call_depth
// frames at most.
constexpr int kMaxStatementNesting = 64;
constexpr int kMaxExpressionDepth = 128;

// ---------------------------------------------------------------------------------------------
// Parser: recursive descent with Jinja's precedence, lowest first:
//   cond-expr (a if c else b) < or < and < not < compare (== != < <= > >= in, not in)
//   < + - < ~ < * / // % < ** < unary - + < postfix (.x [i] (args)) then | filter and is test

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse_template() {
    std::string end_tag;
    Body body = parse_body({}, end_tag);
    return body;
  }

 private:
  const Token& cur() const { return tokens_[at_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(at_ + ahead, tokens_.size() - 1)];
  }
  Token take() {
    Token t = tokens_[at_];
    if (at_ + 1 < tokens_.size()) ++at_;
    return t;
  }
  bool is_op(std::string_view op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(std::string_view name) const {
    return cur().type == Tok::kName && cur().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    take();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    take();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kText:
        return "template text";
      case Tok::kVarBegin:
        return "'{{'";
      case Tok::kVarEnd:
        return "'}}'";
      case Tok::kBlockBegin:
        return "'{%'";
      case Tok::kBlockEnd:
        return "'%}'";
      case Tok::kString:
        return "string literal";
      case Tok::kInt:
      case Tok::kFloat:
        return "number";
      default:
        return "'" + t.text + "'";
    }
  }
  [[noreturn]] void unexpected(std::string_view expected) const {
    fail_at(cur().pos, fmt::format("expected {}, got {}", expected, describe(cur())));
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected(fmt::format("'{}'", op));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) unexpected("a name");
    return take().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) unexpected("'%}'");
    take();
  }

  template <typename T>
  std::unique_ptr<T> make(Pos pos) {
    auto node = std::make_unique<T>();
    node->pos = pos;
    return node;
  }
  // Records the height of a new composite expression; deep trees would exhaust the stack.
  template <typename T>
  std::unique_ptr<T> sized(std::unique_ptr<T> node, std::initializer_list<const Expr*> children) {
    int depth = 0;
    for (const Expr* c : children) {
      if (c != nullptr) depth = std::max(depth, c->depth);
    }
    node->depth = depth + 1;
    if (node->depth > kMaxExpressionDepth) fail_at(node->pos, "expression nests too deeply");
    return node;
  }

  // ---- statements ----

  // Parses until a block tag named in `end_tags` (its name is consumed and stored in `end_tag`;
  // the rest of that tag is left to the caller), or the end of the template if `end_tags` is
  // empty.
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string& end_tag) {
    if (++nesting_ > kMaxStatementNesting) fail_at(cur().pos, "statements nest too deeply");
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (end_tags.size() == 0) break;
        fail_at(t.pos,
                fmt::format("unexpected end of template, expected '{}'", *(end_tags.end() - 1)));
      }
      if (t.type == Tok::kText) {
        auto node = make<TextNode>(t.pos);
        node->text = take().text;
        body.push_back(std::move(node));
      } else if (t.type == Tok::kVarBegin) {
        auto node = make<OutputNode>(take().pos);
        node->expr = parse_expression();
        if (cur().type != Tok::kVarEnd) unexpected("'}}'");
        take();
        body.push_back(std::move(node));
      } else if (t.type == Tok::kBlockBegin) {
        const Pos pos = take().pos;
        if (cur().type != Tok::kName) unexpected("a statement name");
        const std::string name = cur().text;
        if (std::find(end_tags.begin(), end_tags.end(), name) != end_tags.end()) {
          take();
          end_tag = name;
          --nesting_;
          return body;
        }
        body.push_back(parse_statement(pos));
      } else {
        unexpected("template text or a tag");
      }
    }
    --nesting_;
    return body;
  }

  NodePtr parse_statement(Pos pos) {
    const Token name_token = take();
    const std::string& name = name_token.text;
    if (name == "if") return parse_if(pos);
    if (name == "for") return parse_for(pos);
    if (name == "set") return parse_set(pos);
    if (name == "macro") return parse_macro(pos);
    if (name == "filter") return parse_filter_block(pos);
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(name_token.pos, fmt::format("'{}' outside a loop", name));
      auto node = make<LoopControlNode>(pos);
      node->flow = name == "break" ? Flow::kBreak : Flow::kContinue;
      expect_block_end();
      return node;
    }
    if (name == "generation") {
      expect_block_end();
      auto node = make<BodyNode>(pos);
      std::string end_tag;
      node->body = parse_body({"endgeneration"}, end_tag);
      expect_block_end();
      return node;
    }
    fail_at(name_token.pos, fmt::format("unknown statement '{}'", name));
  }

  NodePtr parse_if(Pos pos) {
    auto node = make<IfNode>(pos);
    ExprPtr cond = parse_expression();
    while (true) {
      expect_block_end();
      std::string end_tag;
      Body body = parse_body({"elif", "else", "endif"}, end_tag);
      node->branches.emplace_back(std::move(cond), std::move(body));
      if (end_tag == "elif") {
        cond = parse_expression();
        continue;
      }
      if (end_tag == "else") {
        expect_block_end();
        node->otherwise = parse_body({"endif"}, end_tag);
      }
      expect_block_end();
      return node;
    }
  }

  NodePtr parse_for(Pos pos) {
    auto node = make<ForNode>(pos);
    const bool parenthesized = skip_op("(");
    do {
      node->targets.push_back(expect_name());
    } while (skip_op(","));
    if (parenthesized) expect_op(")");
    if (!skip_name("in")) unexpected("'in'");
    // No conditional expression here: a trailing `if` filters the items.
    node->iterable = parse_or();
    if (is_op(",")) {  // for x in a, b
      auto items = make<ListLiteral>(cur().pos);
      items->tuple = true;
      items->items.push_back(std::move(node->iterable));
      while (skip_op(",")) {
        if (is_name("if") || cur().type == Tok::kBlockEnd) break;
        items->items.push_back(parse_or());
      }
      node->iterable = std::move(items);
    }
    if (skip_name("if")) node->filter = parse_expression();
    if (is_name("recursive")) fail_at(cur().pos, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end_tag;
    node->body = parse_body({"else", "endfor"}, end_tag);
    --loop_depth_;
    if (end_tag == "else") {
      expect_block_end();
      node->otherwise = parse_body({"endfor"}, end_tag);
    }
    expect_block_end();
    return node;
  }

  NodePtr parse_set(Pos pos) {
    auto node = make<SetNode>(pos);
    node->targets.push_back(expect_name());
    if (skip_op(".")) {
      node->attribute = expect_name();
    } else {
      while (skip_op(",")) node->targets.push_back(expect_name());
    }
    if (skip_op("=")) {
      node->value = parse_tuple();
      expect_block_end();
      return node;
    }
    if (node->targets.size() != 1 || !node->attribute.empty()) unexpected("'='");
    expect_block_end();
    std::string end_tag;
    node->body = parse_body({"endset"}, end_tag);
    expect_block_end();
    return node;
  }

  NodePtr parse_macro(Pos pos) {
    auto node = make<MacroNode>(pos);
    node->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      std::string param = expect_name();
      ExprPtr default_value;
      if (skip_op("=")) default_value = parse_expression();
      node->params.emplace_back(std::move(param), std::move(default_value));
      if (!skip_op(",")) break;
    }
    expect_op(")");
    expect_block_end();
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end_tag;
    node->body = parse_body({"endmacro"}, end_tag);
    loop_depth_ = saved_loop_depth;
    if (cur().type == Tok::kName) take();  // {% endmacro name %}
    expect_block_end();
    return node;
  }

  NodePtr parse_filter_block(Pos pos) {
    auto node = make<FilterBlockNode>(pos);
    node->filter = parse_filter_call(nullptr);
    expect_block_end();
    std::string end_tag;
    node->body = parse_body({"endfilter"}, end_tag);
    expect_block_end();
    return node;
  }

  // ---- expressions ----

  // `a, b` without brackets (in {% set %}) is a tuple.
  ExprPtr parse_tuple() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto items = make<ListLiteral>(first->pos);
    items->tuple = true;
    items->items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == Tok::kBlockEnd) break;
      items->items.push_back(parse_expression());
    }
    int depth = 0;
    for (const auto& e : items->items) depth = std::max(depth, e->depth);
    items->depth = depth + 1;
    return items;
  }

  ExprPtr parse_expression() {
    if (++expr_nesting_ > kMaxExpressionDepth) fail_at(cur().pos, "expression nests too deeply");
    ExprPtr e = parse_conditional();
    --expr_nesting_;
    return e;
  }

  ExprPtr parse_conditional() {
    ExprPtr then = parse_or();
    while (is_name("if")) {
      auto node = make<Conditional>(take().pos);
      node->cond = parse_or();
      if (skip_name("else")) node->otherwise = parse_conditional();
      node->then = std::move(then);
      const Expr *a = node->then.get(), *b = node->cond.get(), *c = node->otherwise.get();
      then = sized(std::move(node), {a, b, c});
    }
    return then;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, Pos pos) {
    auto node = make<Binary>(pos);
    node->op = std::move(op);
    node->left = std::move(left);
    node->right = std::move(right);
    const Expr* l = node->left.get();
    const Expr* r = node->right.get();
    return sized(std::move(node), {l, r});
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Pos pos = take().pos;
      left = binary("or", std::move(left), parse_and(), pos);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Pos pos = take().pos;
      left = binary("and", std::move(left), parse_not(), pos);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      auto node = make<Unary>(take().pos);
      node->op = '!';
      if (++expr_nesting_ > kMaxExpressionDepth) fail_at(node->pos, "expression nests too deeply");
      node->operand = parse_not();
      --expr_nesting_;
      const Expr* operand = node->operand.get();
      return sized(std::move(node), {operand});
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    std::unique_ptr<Compare> node;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == "<=" ||
           cur().text == ">" || cur().text == ">=")) {
        op = cur().text;
        take();
      } else if (is_name("in")) {
        op = "in";
        take();
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        op = "notin";
        take();
        take();
      } else {
        break;
      }
      if (!node) {
        node = make<Compare>(first->pos);
        node->first = std::move(first);
      }
      node->rest.emplace_back(std::move(op), parse_math1());
    }
    if (!node) return first;
    int depth = node->first->depth;
    for (const auto& [op, e] : node->rest) depth = std::max(depth, e->depth);
    node->depth = depth + 1;
    if (node->depth > kMaxExpressionDepth) fail_at(node->pos, "expression nests too deeply");
    return node;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token op = take();
      left = binary(op.text, std::move(left), parse_concat(), op.pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Pos pos = take().pos;
      left = binary("~", std::move(left), parse_math2(), pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = take();
      left = binary(op.text, std::move(left), parse_pow(), op.pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Pos pos = take().pos;
      left = binary("**", std::move(left), parse_unary(true), pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto unary = make<Unary>(cur().pos);
      unary->op = take().text[0];
      if (++expr_nesting_ > kMaxExpressionDepth) fail_at(unary->pos, "expression nests too deeply");
      unary->operand = parse_unary(false);
      --expr_nesting_;
      const Expr* operand = unary->operand.get();
      node = sized(std::move(unary), {operand});
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filters_and_tests(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        const Token name = take();
        if (name.text == "true" || name.text == "True") return literal(boolean(true), name.pos);
        if (name.text == "false" || name.text == "False") return literal(boolean(false), name.pos);
        if (name.text == "none" || name.text == "None") return literal(none(), name.pos);
        auto node = make<Name>(name.pos);
        node->name = name.text;
        return node;
      }
      case Tok::kString: {
        const Pos pos = t.pos;
        std::string text = take().text;
        while (cur().type == Tok::kString) text += take().text;  // 'a' 'b' is 'ab'
        return literal(string(std::move(text)), pos);
      }
      case Tok::kInt:
        return literal(integer(t.integer), take().pos);
      case Tok::kFloat:
        return literal(floating(t.number), take().pos);
      case Tok::kOp:
        break;
      default:
        unexpected("an expression");
    }
    const Pos pos = t.pos;
    if (skip_op("(")) {
      if (skip_op(")")) return literal(tuple({}), pos);  // ()
      ExprPtr first = parse_expression();
      if (skip_op(")")) return first;
      auto items = make<ListLiteral>(pos);
      items->tuple = true;
      items->items.push_back(std::move(first));
      while (skip_op(",")) {
        if (is_op(")")) break;
        items->items.push_back(parse_expression());
      }
      expect_op(")");
      return finish_list(std::move(items));
    }
    if (skip_op("[")) {
      auto items = make<ListLiteral>(pos);
      while (!is_op("]")) {
        items->items.push_back(parse_expression());
        if (!skip_op(",")) break;
      }
      expect_op("]");
      return finish_list(std::move(items));
    }
    if (skip_op("{")) {
      auto node = make<DictLiteral>(pos);
      int depth = 0;
      while (!is_op("}")) {
        ExprPtr key = parse_expression();
        expect_op(":");
        ExprPtr value = parse_expression();
        depth = std::max({depth, key->depth, value->depth});
        node->items.emplace_back(std::move(key), std::move(value));
        if (!skip_op(",")) break;
      }
      expect_op("}");
      node->depth = depth + 1;
      if (node->depth > kMaxExpressionDepth) fail_at(pos, "expression nests too deeply");
      return node;
    }
    unexpected("an expression");
  }

  ExprPtr finish_list(std::unique_ptr<ListLiteral> items) {
    int depth = 0;
    for (const auto& e : items->items) depth = std::max(depth, e->depth);
    items->depth = depth + 1;
    if (items->depth > kMaxExpressionDepth) fail_at(items->pos, "expression nests too deeply");
    return items;
  }

  ExprPtr literal(Value v, Pos pos) {
    auto node = make<Literal>(pos);
    node->value = std::move(v);
    return node;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Pos pos = take().pos;
        auto attr = make<Attr>(pos);
        if (cur().type == Tok::kInt) {  // x.0 is x[0]
          auto sub = make<Subscript>(pos);
          sub->index = literal(integer(take().integer), pos);
          sub->object = std::move(node);
          const Expr* object = sub->object.get();
          node = sized(std::move(sub), {object});
          continue;
        }
        attr->name = expect_name();
        attr->object = std::move(node);
        const Expr* object = attr->object.get();
        node = sized(std::move(attr), {object});
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {
    const Pos pos = take().pos;  // '['
    ExprPtr start, stop, step;
    if (!is_op(":")) start = parse_expression();
    if (skip_op("]")) {
      auto sub = make<Subscript>(pos);
      sub->object = std::move(object);
      sub->index = std::move(start);
      const Expr *o = sub->object.get(), *i = sub->index.get();
      return sized(std::move(sub), {o, i});
    }
    expect_op(":");
    if (!is_op(":") && !is_op("]")) stop = parse_expression();
    if (skip_op(":")) {
      if (!is_op("]")) step = parse_expression();
    }
    expect_op("]");
    auto slice = make<Slice>(pos);
    slice->object = std::move(object);
    slice->start = std::move(start);
    slice->stop = std::move(stop);
    slice->step = std::move(step);
    const Expr *o = slice->object.get(), *a = slice->start.get(), *b = slice->stop.get(),
               *c = slice->step.get();
    return sized(std::move(slice), {o, a, b, c});
  }

  // Parses `(args)` after the current position; both call expressions and filters use it.
  int parse_arguments(std::vector<ExprPtr>& args,
                      std::vector<std::pair<std::string, ExprPtr>>& kwargs) {
    expect_op("(");
    int depth = 0;
    while (!is_op(")")) {
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        std::string key = take().text;
        take();
        kwargs.emplace_back(std::move(key), parse_expression());
        depth = std::max(depth, kwargs.back().second->depth);
      } else {
        if (!kwargs.empty()) fail_at(cur().pos, "positional argument follows keyword argument");
        args.push_back(parse_expression());
        depth = std::max(depth, args.back()->depth);
      }
      if (!skip_op(",")) break;
    }
    expect_op(")");
    return depth;
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto call = make<Call>(cur().pos);
    call->callee = std::move(callee);
    const int depth = parse_arguments(call->args, call->kwargs);
    call->depth = std::max(depth, call->callee->depth) + 1;
    if (call->depth > kMaxExpressionDepth) fail_at(call->pos, "expression nests too deeply");
    return call;
  }

  std::unique_ptr<Filter> parse_filter_call(ExprPtr operand) {
    auto filter = make<Filter>(cur().pos);
    filter->name = expect_name();
    filter->fn = find_filter(filter->name);
    if (filter->fn == nullptr)
      fail_at(filter->pos, fmt::format("unknown filter '{}'", filter->name));
    int depth = operand ? operand->depth : 0;
    if (is_op("(")) depth = std::max(depth, parse_arguments(filter->args, filter->kwargs));
    filter->operand = std::move(operand);
    filter->depth = depth + 1;
    if (filter->depth > kMaxExpressionDepth) fail_at(filter->pos, "expression nests too deeply");
    return filter;
  }

  ExprPtr parse_filters_and_tests(ExprPtr node) {
    while (true) {
      if (skip_op("|")) {
        node = parse_filter_call(std::move(node));
      } else if (is_name("is")) {
        node = parse_test(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_test(ExprPtr operand) {
    auto test = make<Test>(take().pos);  // 'is'
    test->negated = skip_name("not");
    const Token name = cur();
    std::string test_name = expect_name();
    test->fn = find_test(test_name);
    if (test->fn == nullptr) fail_at(name.pos, fmt::format("unknown test '{}'", test_name));
    int depth = operand->depth;
    if (is_op("(")) {
      std::vector<std::pair<std::string, ExprPtr>> kwargs;
      depth = std::max(depth, parse_arguments(test->args, kwargs));
      if (!kwargs.empty()) fail_at(test->pos, "tests take no keyword arguments");
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      // `x is divisibleby 3`: one argument without parentheses
      if (is_name("is")) fail_at(cur().pos, "tests cannot be chained with 'is'");
      test->args.push_back(parse_postfix(parse_primary()));
      depth = std::max(depth, test->args.back()->depth);
    }
    test->operand = std::move(operand);
    test->depth = depth + 1;
    if (test->depth > kMaxExpressionDepth) fail_at(test->pos, "expression nests too deeply");
    return test;
  }

  std::vector<Token> tokens_;
  size_t at_ = 0;
  int nesting_ = 0;
  int expr_nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) {
  Parser parser(lex(source));
  return parser.parse_template();
}

}  // namespace sieve::jinja
