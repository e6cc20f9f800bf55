#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "util/error.h"

namespace sieve::grammar {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_gbnf(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> sorted_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

TEST(GbnfParser, RoundTripsThroughPrinting) {
  const char* grammars[] = {
      R"(root ::= "hello" | "world")",
      R"(root ::= [a-z]+ ("," [a-z]+)* "."?)",
      R"(root ::= "x"{3} "y"{2,} "z"{1,4} [^"\\] . "\n\t\"\\\x01\u00e9\U0001F600")",
      "root ::= item*\nitem ::= \"[\" ws \"]\" | \"(\" ws \")\"\nws ::= [ \\t\\n]{0,3}",
      R"(root ::= "é☃😀" [α-ω] [\-\]\[^])",
      "root ::= \"\" | \"a\"",
  };
  for (const char* text : grammars) {
    SCOPED_TRACE(text);
    const Grammar g = parse_gbnf(text);
    const std::string printed = to_gbnf(g);
    // Rules may come back in another order (by first mention); the rules themselves are equal.
    EXPECT_EQ(sorted_lines(to_gbnf(parse_gbnf(printed))), sorted_lines(printed));
  }
}

TEST(GbnfParser, ParsesStructure) {
  const Grammar g = parse_gbnf(R"(
# comment
root ::= a | b   # trailing comment
  | "c"
a ::= "ab" [0-9]
b ::= [^a-c]
)");
  ASSERT_EQ(g.rules.size(), 3u);
  EXPECT_EQ(g.rules[g.root_idx].name, "root");
  EXPECT_EQ(g.rules[g.root_idx].alternatives.size(), 3u);
  const Rule& a = g.rules[1];
  EXPECT_EQ(a.name, "a");
  ASSERT_EQ(a.alternatives[0].size(), 3u);
  EXPECT_EQ(a.alternatives[0][2].ranges, (std::vector<CharRange>{{'0', '9'}}));
  const Rule& b = g.rules[2];
  EXPECT_EQ(b.alternatives[0][0].ranges,
            (std::vector<CharRange>{{0, 'a' - 1}, {'d', 0xD7FF}, {0xE000, kMaxCodePoint}}));
}

TEST(GbnfParser, ErrorsSayWhereAndWhat) {
  struct Case {
    std::string text;
    std::string expected;
  };
  const Case cases[] = {
      {"root ::= \"abc", "grammar:1:14: unterminated string literal"},
      {"root ::= foo", "grammar:1:10: undefined rule 'foo'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "grammar:2:1: rule 'root' is defined twice"},
      {"start ::= \"a\"", "no rule named 'root'"},
      {"root ::= [b-a]", "grammar:1:11: character range with its end before its start"},
      {"root ::= [^\\x00-\\U0010FFFF]", "grammar:1:10: character class matches nothing"},
      {"root ::= (\"a\" | \"b\"", "grammar:1:10: unclosed '('"},
      {"root ::= \"a\" )", "grammar:1:14: expected a rule name"},
      {"root ::= \"\\q\"", "grammar:1:11: unknown escape '\\q'"},
      {"root ::= \"a\"{2,1}", "grammar:1:13: repetition {m,n} with n < m"},
      {"root ::= \"a\"{1000000}", "repetition count over 100000"},
      {"root ::= \"\\uD800\"", "not a Unicode scalar value"},
      {"root\n::= \"a\"", "grammar:1:5: expected '::='"},
      {"", "empty grammar"},
      {"root ::= \"a\" root", "rule 'root' can never finish"},
      {"root ::= list\nlist ::= list \",\" \"x\" | \"x\"", "left recursion (list -> list)"},
      {"root ::= a\na ::= b \"x\"\nb ::= \"\" | a", "left recursion (a -> b -> a)"},
      {"root ::= (\"a\"?)*", "left recursion"},
      {"root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'),
       "grammar:1:266: groups nest deeper than 256 levels"},
  };
  for (const Case& c : cases) {
    const std::string error = error_of(c.text);
    EXPECT_NE(error.find(c.expected), std::string::npos)
        << "grammar: " << c.text << "\nerror: " << error << "\nexpected: " << c.expected;
  }
}

// A grammar's size is bounded only by the request body: the checks after parsing walk it in
// loops, not one call per rule (a chain of 10^5 rules took minutes and then overflowed the stack).
TEST(GbnfParser, LongChainsOfRulesAreCheckedWithoutRecursion) {
  constexpr int kRules = 100000;
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < kRules; ++i) chain += fmt::format("r{} ::= r{}\n", i, i + 1);
  chain += fmt::format("r{} ::= \"a\"\n", kRules);
  EXPECT_EQ(parse_gbnf(chain).rules.size(), static_cast<size_t>(kRules + 2));
  // The same chain, defined last to first: each rule is known to finish only after the next.
  std::string reversed = fmt::format("r{} ::= \"a\"\n", kRules);
  for (int i = kRules - 1; i >= 0; --i) reversed += fmt::format("r{} ::= r{}\n", i, i + 1);
  reversed += "root ::= r0\n";
  EXPECT_EQ(parse_gbnf(reversed).rules.size(), static_cast<size_t>(kRules + 2));
  // Closed into a cycle: left recursion through all of them, named.
  std::string cycle = "root ::= r0\n";
  for (int i = 0; i < kRules; ++i)
    cycle += fmt::format("r{} ::= r{} | \"b\"\n", i, (i + 1) % kRules);
  const std::string error = error_of(cycle);
  EXPECT_NE(error.find("left recursion (r0 -> r1 -> r2 -> "), std::string::npos)
      << error.substr(0, 200);
  EXPECT_NE(error.find("r99999 -> r0)"), std::string::npos);
}

}  // namespace
}  // namespace sieve::grammar
