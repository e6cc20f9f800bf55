#pragma once
// The template lexer: source -> tokens (text, tag delimiters, names, literals, operators).
// Whitespace control ('-' / '+' tag modifiers, trim_blocks-style defaults) is applied to the
// text tokens before they are handed out.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/syntax.h"

namespace sieve::jinja {

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

// The tokens of `source`, ending with one kEof. Throws sieve::Error (fail_at, value.h) with the
// position of a malformed tag, string or number.
std::vector<Token> lex(std::string_view source);

}  // namespace sieve::jinja
