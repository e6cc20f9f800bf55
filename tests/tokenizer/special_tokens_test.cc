// Special-token partitioning on a hand-made vocabulary.
#include "tokenizer/special_tokens.h"

#include <gtest/gtest.h>

namespace sieve::tok {
namespace {

// ids: 0 "a" (normal), 1 "<a>" (control), 2 "a>bc" (control), 3 "[x]" (user-defined),
//      4 "<unk>" (unknown), 5 "xx" (user-defined), 6 "xxx" (user-defined)
Vocab make_vocab() {
  Vocab vocab;
  vocab.kind = VocabKind::kSpm;
  vocab.tokens = {"a", "<a>", "a>bc", "[x]", "<unk>", "xx", "xxx"};
  vocab.types = {TokenType::kNormal,      TokenType::kControl, TokenType::kControl,
                 TokenType::kUserDefined, TokenType::kUnknown, TokenType::kUserDefined,
                 TokenType::kUserDefined};
  vocab.scores.assign(vocab.tokens.size(), 0.0f);
  return vocab;
}

// Fragments as strings: text as is, tokens as "#id".
std::vector<std::string> parts(std::string_view text, bool parse_special) {
  SpecialTokenMatcher matcher(make_vocab());
  std::vector<std::string> out;
  for (const Fragment& f : matcher.partition(text, parse_special)) {
    // (Appending instead of "#" + to_string(): GCC 12 raises a false -Wrestrict on that.)
    std::string part(f.token ? "#" : "");
    part.append(f.token ? std::to_string(*f.token) : std::string(f.text));
    out.push_back(std::move(part));
  }
  return out;
}

using Parts = std::vector<std::string>;

TEST(SpecialTokens, ControlTokensOnlyWithParseSpecial) {
  EXPECT_EQ(parts("1<a>2", true), (Parts{"1", "#1", "2"}));
  EXPECT_EQ(parts("1<a>2", false), (Parts{"1<a>2"}));
  EXPECT_EQ(parts("<unk>", true), (Parts{"#4"}));
  EXPECT_EQ(parts("<unk>", false), (Parts{"<unk>"}));
}

TEST(SpecialTokens, UserDefinedAlways) {
  EXPECT_EQ(parts("1[x]2[x]", false), (Parts{"1", "#3", "2", "#3"}));
  EXPECT_EQ(parts("[x][x]", true), (Parts{"#3", "#3"}));
}

TEST(SpecialTokens, LongerTokensWinEvenWhenTheyStartLater) {
  EXPECT_EQ(parts("<a>bc", true), (Parts{"<", "#2"}));
  EXPECT_EQ(parts("<a>b", true), (Parts{"#1", "b"}));
}

TEST(SpecialTokens, OccurrencesDoNotOverlap) {
  // "xxx" (longer) first, leftmost; then "xx" in what is left.
  EXPECT_EQ(parts("xxxxx", false), (Parts{"#6", "#5"}));
  EXPECT_EQ(parts("xxxx", false), (Parts{"#6", "x"}));
  EXPECT_EQ(parts("xx", false), (Parts{"#5"}));
}

TEST(SpecialTokens, EmptyAndPlainText) {
  EXPECT_EQ(parts("", true), Parts{});
  EXPECT_EQ(parts("plain", true), (Parts{"plain"}));
}

}  // namespace
}  // namespace sieve::tok
