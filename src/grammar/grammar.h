#pragma once
// Grammars for constrained decoding, written in a GBNF-style syntax (llama.cpp's dialect, a
// little more lenient):
//
//   # a comment runs to the end of the line
//   root   ::= "{" ws pair ("," ws pair)* "}"      # rule ::= alternatives
//   pair   ::= key ":" ws [0-9]+
//   key    ::= "\"" [a-z_]{1,16} "\""
//   ws     ::= [ \t\n]{0,4}
//
// - A grammar is a list of rules `name ::= body`; names are [A-Za-z0-9_-]+ and `root` is where
//   the text starts. A rule's body may span lines: a rule ends where the next `name ::=` starts.
// - Bodies: alternatives separated by `|`; sequences of items; `( ... )` groups; an empty
//   alternative (or `""`) matches nothing, e.g. `opt ::= "x" | `.
// - Items: "literal" (escapes \n \r \t \" \\ \' \[ \] \- \/ \xHH \uHHHH \UHHHHHHHH; raw UTF-8 is
//   fine); character classes [a-z_], negated [^"\\] (same escapes); `.` any character; a rule
//   name.
// - Repetition after an item: `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}` (n <= 100000). Repetitions
//   become right-recursive helper rules, so `x*` over a long text keeps a bounded stack.
// - Characters are Unicode scalar values (U+0000..U+10FFFF without the surrogates); the text is
//   UTF-8.
//
// Refused with a sieve::Error "grammar:LINE:COL: what": syntax errors, an undefined or twice
// defined rule, no `root`, a class that matches nothing. Refused after parsing, naming the
// rule: left recursion (a rule that can reach itself before consuming a character, also
// through rules that may match nothing, e.g. `("a"?)*`), and rules that can never finish
// (`a ::= "x" a`). Left recursion is refused rather than rewritten: write `x ("," x)*` instead
// of `list ::= list "," x | x`.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sieve::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct CharRange {
  uint32_t lo = 0;  // inclusive
  uint32_t hi = 0;  // inclusive
  friend bool operator==(const CharRange&, const CharRange&) = default;
};

struct Element {
  enum class Kind : uint8_t { kChars, kRule };
  Kind kind = Kind::kChars;
  // kChars: one character from these ranges; sorted, disjoint, not adjacent, never empty, no
  // surrogates.
  std::vector<CharRange> ranges;
  uint32_t rule_idx = 0;  // kRule
  friend bool operator==(const Element&, const Element&) = default;
};

using Sequence = std::vector<Element>;

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives;  // never empty
  friend bool operator==(const Rule&, const Rule&) = default;
};

struct Grammar {
  std::vector<Rule> rules;
  uint32_t root_idx = 0;
  friend bool operator==(const Grammar&, const Grammar&) = default;
};

// Parses and checks a grammar (see above); throws sieve::Error.
Grammar parse_gbnf(std::string_view text);

// Prints a grammar back in the same syntax, one rule a line (helper rules under their generated
// names such as `root-3`): parsing the text gives the same rules, perhaps in another order.
std::string to_gbnf(const Grammar& grammar);

// Escapes text as the body of a GBNF string literal (without the quotes).
std::string escape_gbnf_literal(std::string_view utf8);

// The checks parse_gbnf runs after parsing (left recursion, rules that never finish); throws
// sieve::Error naming the rule.
void check_grammar(const Grammar& grammar);

}  // namespace sieve::grammar
