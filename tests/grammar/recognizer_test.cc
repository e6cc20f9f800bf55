#include <gtest/gtest.h>

#include <string>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_state.h"
#include "util/error.h"

namespace sieve::grammar {
namespace {

// Whole text accepted and complete?
bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarState state(g);
  return state.accept_bytes(text) && state.can_end();
}

TEST(Recognizer, AcceptsAndRejects) {
  struct Case {
    const char* grammar;
    std::vector<std::string> yes;
    std::vector<std::string> no;
  };
  const Case cases[] = {
      {R"(root ::= "hello" | "help")", {"hello", "help"}, {"hel", "hellos", "", "Hello"}},
      {R"(root ::= [a-c]+ ("," [a-c]+)*)", {"a", "abc,b,cc"}, {"", ",a", "a,", "ad"}},
      {R"(root ::= "x"{2,3} "y"?)", {"xx", "xxx", "xxy", "xxxy"}, {"x", "xxxx", "xy"}},
      {R"(root ::= "n"{2,})", {"nn", "nnnnnnnn"}, {"n", ""}},
      {R"(root ::= "" | "a" root "b")", {"", "ab", "aaabbb"}, {"a", "abb", "ba"}},
      {R"(root ::= [^"\\]* "\"")", {"\"", "abc\"", "é☃\""}, {"a\\\"", "\"\""}},
      {R"(root ::= . . .)", {"abc", "é☃😀"}, {"ab", "abcd"}},
      {R"(root ::= [α-ω]+)", {"αβω"}, {"a", "αA"}},
      {"root ::= obj\nobj ::= \"{\" (obj (\",\" obj)*)? \"}\"", {"{}", "{{},{{}}}"}, {"{", "{,}"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.grammar);
    const auto g = CompiledGrammar::from_gbnf(c.grammar);
    for (const std::string& s : c.yes) EXPECT_TRUE(matches(g, s)) << s;
    for (const std::string& s : c.no) EXPECT_FALSE(matches(g, s)) << s;
  }
}

// Expanding the rules at the top of a stack is a loop, not one call per rule: a chain of 10^5
// rules before the first character, or 10^5 rules in a row that may match nothing, would
// overflow the stack.
TEST(Recognizer, LongChainsExpandWithoutRecursion) {
  constexpr int kRules = 100000;
  std::string chain = "root ::= r0 \"!\"\n";
  for (int i = 0; i < kRules; ++i)
    chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r" + std::to_string(kRules) + " ::= \"a\" | \"b\"\n";
  const auto g = CompiledGrammar::from_gbnf(chain);
  EXPECT_TRUE(matches(g, "a!"));
  EXPECT_TRUE(matches(g, "b!"));
  EXPECT_FALSE(matches(g, "c!"));
  // A chain of rules that match nothing: past each one's end, back to the one that named it.
  std::string nullable = "root ::= n0 \"z\"\n";
  for (int i = 0; i < kRules; ++i)
    nullable += "n" + std::to_string(i) + " ::= n" + std::to_string(i + 1) + "\n";
  nullable += "n" + std::to_string(kRules) + " ::= \"\"\n";
  EXPECT_TRUE(matches(CompiledGrammar::from_gbnf(nullable), "z"));
  // 60000 rules in a row that may each match nothing or "y": every one of them may be where a
  // "y" starts, more parses than the automaton keeps: an error, not a crash.
  std::string empties = "root ::= ";
  for (int i = 0; i < 60000; ++i) empties += "e ";
  empties += "\"z\"\ne ::= \"\" | \"y\"\n";
  const auto g2 = CompiledGrammar::from_gbnf(empties);
  try {
    GrammarState state(g2);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("grammar too ambiguous"), std::string::npos) << e.what();
  }
}

TEST(Recognizer, RejectionLeavesTheStateAsItWas) {
  GrammarState state(CompiledGrammar::from_gbnf(R"(root ::= "abc" "d"*)"));
  EXPECT_TRUE(state.accept_bytes("ab"));
  EXPECT_FALSE(state.accept_bytes("cx"));
  EXPECT_FALSE(state.can_end());
  EXPECT_TRUE(state.accept_bytes("c"));
  EXPECT_TRUE(state.can_end());
  EXPECT_TRUE(state.accept_bytes("dd"));
  EXPECT_TRUE(state.can_end());
  EXPECT_TRUE(state.can_continue());
}

TEST(Recognizer, Utf8SplitAcrossCalls) {
  const auto g = CompiledGrammar::from_gbnf(R"(root ::= "a" [é😀]+ "z")");
  const std::string text = "a\xC3\xA9\xF0\x9F\x98\x80z";  // a é 😀 z
  // Every way of cutting the text into two or three pieces gives the same answer.
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      GrammarState state(g);
      ASSERT_TRUE(state.accept_bytes(text.substr(0, i)));
      ASSERT_TRUE(state.accept_bytes(text.substr(i, j - i)));
      ASSERT_TRUE(state.accept_bytes(text.substr(j)));
      EXPECT_TRUE(state.can_end());
    }
  }
  GrammarState state(g);
  ASSERT_TRUE(state.accept_bytes("a\xF0\x9F"));
  EXPECT_TRUE(state.in_partial_char());
  EXPECT_FALSE(state.can_end());
  EXPECT_FALSE(state.accept_bytes("\x98\x81"));  // 😁 is not in the class
  EXPECT_FALSE(state.accept_bytes("z"));         // not a continuation byte
  GrammarState fork = state.fork();
  EXPECT_TRUE(fork.accept_bytes("\x98"));
  EXPECT_TRUE(fork.accept_bytes("\x80z"));
  EXPECT_TRUE(fork.can_end());
  EXPECT_FALSE(state.can_end());  // the original did not move
  // A lead byte no class can start, an overlong form and a surrogate are refused.
  GrammarState any(CompiledGrammar::from_gbnf("root ::= .*"));
  EXPECT_FALSE(any.accept_bytes("\xC0\x80"));
  EXPECT_FALSE(any.accept_bytes("\xE0\x80\x80"));
  EXPECT_FALSE(any.accept_bytes("\xED\xA0\x80"));
  EXPECT_FALSE(any.accept_bytes("\xF4\x90\x80\x80"));
  EXPECT_TRUE(any.accept_bytes("\xF4\x8F\xBF\xBF"));
}

}  // namespace
}  // namespace sieve::grammar
