#include "jinja/syntax.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "jinja/builtins.h"

namespace sieve::jinja {
namespace {

// Nesting bounds checked while parsing, so that evaluation (recursive over the AST) stays within
// a small, fixed stack budget per macro call: (statements + expression depth) * max_call_depth
// frames at most.
constexpr int kMaxStatementNesting = 64;
constexpr int kMaxExpressionDepth = 128;

// ---------------------------------------------------------------------------------------------
// Lexer: source -> tokens. Whitespace control is applied to the text tokens afterwards, from the
// modifiers of the tags around each one.

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kComment,  // a comment or raw/endraw tag: affects whitespace, then dropped
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type = Tok::kEof;
  std::string text;  // kText/kString: the (decoded) text; kName/kOp: the spelling
  int64_t integer = 0;
  double number = 0;
  Pos pos;
  // Tags: the '-' or '+' after the opening / before the closing delimiter (0 if none).
  char left_mod = 0;
  char right_mod = 0;
  size_t begin = 0, end = 0;  // kText: source range
};

bool is_name_start(char c) { return is_alpha(c) || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  // Like Jinja: line endings become '\n' and one trailing newline is dropped
  // (keep_trailing_newline=False).
  explicit Lexer(std::string_view source) {
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t at = 0;
    while (at < src_.size()) {
      const size_t tag = find_tag(at);
      if (tag > at) push_text(at, tag);
      if (tag == src_.size()) break;
      at = lex_tag(tag);
    }
    apply_whitespace_control();
    std::vector<Token> out;
    for (auto& t : tokens_) {
      if (t.type == Tok::kComment) continue;
      if (t.type == Tok::kText) {
        t.text = src_.substr(t.begin, t.end - t.begin);
        if (t.text.empty()) continue;
      }
      out.push_back(std::move(t));
    }
    Token eof;
    eof.type = Tok::kEof;
    eof.pos = pos_of(src_.size());
    out.push_back(eof);
    return out;
  }

 private:
  Pos pos_of(size_t offset) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Pos{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void push_text(size_t begin, size_t end) {
    Token t;
    t.type = Tok::kText;
    t.begin = begin;
    t.end = end;
    t.pos = pos_of(begin);
    tokens_.push_back(std::move(t));
  }

  char modifier_at(size_t i) const {
    return i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : 0;
  }

  // Returns the offset after the tag.
  size_t lex_tag(size_t start) {
    const char kind = src_[start + 1];
    Token open;
    open.pos = pos_of(start);
    open.left_mod = modifier_at(start + 2);
    size_t at = start + 2 + (open.left_mod ? 1 : 0);
    if (kind == '#') {
      const size_t close = src_.find("#}", at);
      if (close == std::string::npos) fail_at(open.pos, "unterminated comment");
      open.type = Tok::kComment;
      if (close > at && (src_[close - 1] == '-' || src_[close - 1] == '+')) {
        open.right_mod = src_[close - 1];
      }
      tokens_.push_back(open);
      return close + 2;
    }
    const bool is_block = kind == '%';
    const char closer = is_block ? '%' : '}';
    open.type = is_block ? Tok::kBlockBegin : Tok::kVarBegin;
    const size_t first_token = tokens_.size();
    tokens_.push_back(open);
    std::string brackets;  // open ( [ { : an end delimiter inside them is not one
    while (true) {
      while (at < src_.size() && is_space(src_[at])) ++at;
      if (at >= src_.size()) fail_at(open.pos, is_block ? "unclosed '{%'" : "unclosed '{{'");
      if (brackets.empty()) {
        char mod = modifier_at(at);
        const size_t end_at = at + (mod ? 1 : 0);
        if (end_at + 1 < src_.size() && src_[end_at] == closer && src_[end_at + 1] == '}') {
          Token close;
          close.type = is_block ? Tok::kBlockEnd : Tok::kVarEnd;
          close.pos = pos_of(at);
          close.right_mod = mod;
          tokens_.push_back(close);
          at = end_at + 2;
          break;
        }
      }
      at = lex_expression_token(at, brackets);
    }
    // {% raw %}...{% endraw %}: the body is text, taken verbatim.
    if (is_block && tokens_.size() == first_token + 3 &&
        tokens_[first_token + 1].type == Tok::kName && tokens_[first_token + 1].text == "raw") {
      const char left = tokens_[first_token].left_mod, right = tokens_.back().right_mod;
      tokens_.resize(first_token);
      Token raw_open;
      raw_open.type = Tok::kComment;
      raw_open.pos = open.pos;
      raw_open.left_mod = left;
      raw_open.right_mod = right;
      tokens_.push_back(raw_open);
      return lex_raw_body(at, open.pos);
    }
    return at;
  }

  size_t lex_raw_body(size_t at, Pos open_pos) {
    for (size_t i = at; i + 1 < src_.size(); ++i) {
      if (src_[i] != '{' || src_[i + 1] != '%') continue;
      size_t j = i + 2;
      const char left = modifier_at(j);
      if (left) ++j;
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      const char right = modifier_at(j);
      if (right) ++j;
      if (j + 1 >= src_.size() || src_[j] != '%' || src_[j + 1] != '}') continue;
      if (i > at) push_text(at, i);
      Token close;
      close.type = Tok::kComment;
      close.pos = pos_of(i);
      close.left_mod = left;
      close.right_mod = right;
      tokens_.push_back(close);
      return j + 2;
    }
    fail_at(open_pos, "'raw' block without 'endraw'");
  }

  size_t lex_expression_token(size_t at, std::string& brackets) {
    Token t;
    t.pos = pos_of(at);
    const char c = src_[at];
    if (is_name_start(c)) {
      size_t end = at;
      while (end < src_.size() && is_name_char(src_[end])) ++end;
      t.type = Tok::kName;
      t.text = src_.substr(at, end - at);
      tokens_.push_back(std::move(t));
      return end;
    }
    if (is_digit(c)) return lex_number(at, std::move(t));
    if (c == '\'' || c == '"') return lex_string(at, std::move(t));
    static constexpr std::string_view kTwoCharOps[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (std::string_view op : kTwoCharOps) {
      if (src_.compare(at, 2, op) == 0) {
        t.type = Tok::kOp;
        t.text = std::string(op);
        tokens_.push_back(std::move(t));
        return at + 2;
      }
    }
    if (std::string_view("+-*/%~<>=()[]{},.:|").find(c) == std::string_view::npos) {
      fail_at(t.pos, fmt::format("unexpected character '{}'", c));
    }
    if (c == '(' || c == '[' || c == '{') brackets += c;
    if (c == ')' || c == ']' || c == '}') {
      const char opener = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != opener) {
        fail_at(t.pos, fmt::format("unexpected '{}'", c));
      }
      brackets.pop_back();
    }
    t.type = Tok::kOp;
    t.text = std::string(1, c);
    tokens_.push_back(std::move(t));
    return at + 1;
  }

  size_t lex_number(size_t at, Token t) {
    size_t end = at;
    auto digits = [&] {
      while (end < src_.size() && (is_digit(src_[end]) || src_[end] == '_')) ++end;
    };
    digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t exp = end + 1;
      if (exp < src_.size() && (src_[exp] == '+' || src_[exp] == '-')) ++exp;
      if (exp < src_.size() && is_digit(src_[exp])) {
        is_float = true;
        end = exp;
        digits();
      }
    }
    std::string text;
    for (size_t i = at; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    if (is_float) {
      t.type = Tok::kFloat;
      t.number = std::strtod(text.c_str(), nullptr);
    } else {
      t.type = Tok::kInt;
      errno = 0;
      const long long v = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail_at(t.pos, "integer literal out of range");
      t.integer = v;
    }
    tokens_.push_back(std::move(t));
    return end;
  }

  // Python's string-literal escapes (Jinja decodes literals with "unicode-escape").
  size_t lex_string(size_t at, Token t) {
    const char quote = src_[at];
    std::string value;
    size_t i = at + 1;
    auto hex = [&](size_t count) -> uint32_t {
      if (i + count > src_.size()) fail_at(t.pos, "truncated escape in string literal");
      uint32_t cp = 0;
      for (size_t k = 0; k < count; ++k) {
        const char h = src_[i + k];
        cp <<= 4;
        if (is_digit(h)) {
          cp |= static_cast<uint32_t>(h - '0');
        } else if (h >= 'a' && h <= 'f') {
          cp |= static_cast<uint32_t>(h - 'a' + 10);
        } else if (h >= 'A' && h <= 'F') {
          cp |= static_cast<uint32_t>(h - 'A' + 10);
        } else {
          fail_at(t.pos, "bad hex escape in string literal");
        }
      }
      i += count;
      return cp;
    };
    while (true) {
      if (i >= src_.size()) fail_at(t.pos, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail_at(t.pos, "unterminated string literal");
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
          append_utf8(hex(2), value);
          break;
        case 'u':
          append_utf8(hex(4), value);
          break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) fail_at(t.pos, "escape out of the Unicode range");
          append_utf8(cp, value);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i++] - '0');
            }
            append_utf8(cp, value);
          } else {
            value += '\\';  // unknown escapes stay as written
            value += e;
          }
      }
    }
    t.type = Tok::kString;
    t.text = std::move(value);
    tokens_.push_back(std::move(t));
    return i + 1;
  }

  // trim_blocks: the first newline after a block or comment tag goes; lstrip_blocks: spaces and
  // tabs from the start of a line up to a block or comment tag go; '-' strips all whitespace on
  // its side, '+' disables the trim/lstrip on its side.
  void apply_whitespace_control() {
    for (size_t k = 0; k < tokens_.size(); ++k) {
      Token& t = tokens_[k];
      if (t.type != Tok::kText) continue;
      if (k > 0) {
        const Token& prev = tokens_[k - 1];
        const bool block_like = prev.type == Tok::kBlockEnd || prev.type == Tok::kComment;
        if (prev.right_mod == '-') {
          while (t.begin < t.end && is_space(src_[t.begin])) ++t.begin;
        } else if (block_like && prev.right_mod != '+' && t.begin < t.end &&
                   src_[t.begin] == '\n') {
          ++t.begin;
        }
      }
      if (k + 1 < tokens_.size()) {
        const Token& next = tokens_[k + 1];
        const bool block_like = next.type == Tok::kBlockBegin || next.type == Tok::kComment;
        if (next.left_mod == '-') {
          while (t.end > t.begin && is_space(src_[t.end - 1])) --t.end;
        } else if (block_like && next.left_mod != '+') {
          size_t run = t.end;
          while (run > t.begin && (src_[run - 1] == ' ' || src_[run - 1] == '\t')) --run;
          if (run == 0 || src_[run - 1] == '\n') t.end = run;
        }
      }
    }
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

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
  Lexer lexer(source);
  Parser parser(lexer.run());
  return parser.parse_template();
}

}  // namespace sieve::jinja
