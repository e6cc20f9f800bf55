#include "jinja/lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "jinja/builtins.h"
#include "util/utf8.h"

namespace sieve::jinja {
namespace {

// Lexer: source -> tokens. Whitespace control is applied to the text tokens afterwards, from the
// modifiers of the tags around each one.

bool is_name_start(char c) { return is_alpha(c) || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

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
          append_utf8(value, hex(2));
          break;
        case 'u':
          append_utf8(value, hex(4));
          break;
        case 'U': {
          const uint32_t cp = hex(8);
          if (cp > 0x10FFFF) fail_at(t.pos, "escape out of the Unicode range");
          append_utf8(value, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[i++] - '0');
            }
            append_utf8(value, cp);
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

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace sieve::jinja
