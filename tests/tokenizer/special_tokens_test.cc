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

// Hugging Face's added-token flags, on "<x>" (id 1, control) and "[w]" (id 2, user-defined).
std::vector<std::string> flagged_parts(std::string_view text, AddedTokenFlags x_flags,
                                       AddedTokenFlags w_flags = {}) {
  Vocab vocab;
  vocab.kind = VocabKind::kSpm;
  vocab.tokens = {"a", "<x>", "[w]"};
  vocab.types = {TokenType::kNormal, TokenType::kControl, TokenType::kUserDefined};
  vocab.scores.assign(vocab.tokens.size(), 0.0f);
  vocab.added_token_flags = {{}, x_flags, w_flags};
  SpecialTokenMatcher matcher(vocab);
  std::vector<std::string> out;
  for (const Fragment& f : matcher.partition(text, true)) {
    std::string part(f.token ? "#" : "");
    part.append(f.token ? std::to_string(*f.token) : std::string(f.text));
    out.push_back(std::move(part));
  }
  return out;
}

TEST(SpecialTokens, RstripTakesTheWhiteSpaceAfterTheToken) {
  const AddedTokenFlags rstrip{.rstrip = true};
  EXPECT_EQ(flagged_parts("a <x> \n\t b ", rstrip), (Parts{"a ", "#1", "b "}));
  EXPECT_EQ(flagged_parts("<x>\n", rstrip), (Parts{"#1"}));
  EXPECT_EQ(flagged_parts("<x>b", rstrip), (Parts{"#1", "b"}));
  // Unicode White_Space: U+3000, U+00A0 and U+0085 too (as Rust's char::is_whitespace).
  EXPECT_EQ(flagged_parts("<x>\u3000\u00a0\u0085b", rstrip), (Parts{"#1", "b"}));
  // Up to the next token, which keeps its own text.
  EXPECT_EQ(flagged_parts("<x>  <x>  ", rstrip), (Parts{"#1", "#1"}));
  EXPECT_EQ(flagged_parts("<x>  [w]", rstrip), (Parts{"#1", "#2"}));
  // A malformed byte is not white space.
  EXPECT_EQ(flagged_parts("<x> \xff ", rstrip), (Parts{"#1", "\xff "}));
}

TEST(SpecialTokens, LstripTakesTheWhiteSpaceBeforeTheToken) {
  const AddedTokenFlags lstrip{.lstrip = true};
  EXPECT_EQ(flagged_parts("a \n <x> b", lstrip), (Parts{"a", "#1", " b"}));
  EXPECT_EQ(flagged_parts("  <x>", lstrip), (Parts{"#1"}));
  EXPECT_EQ(flagged_parts("a\u3000<x>", lstrip), (Parts{"a", "#1"}));
  // Not back into a previous token's white space: an rstrip token took it first.
  EXPECT_EQ(flagged_parts("[w]  <x>", lstrip, {.rstrip = true}), (Parts{"#2", "#1"}));
  EXPECT_EQ(flagged_parts("[w]  <x>", lstrip), (Parts{"#2", "#1"}));
  EXPECT_EQ(flagged_parts("<x> <x>", {.lstrip = true, .rstrip = true}), (Parts{"#1", "#1"}));
}

TEST(SpecialTokens, SingleWordMatchesOnlyBetweenNonWordCharacters) {
  const AddedTokenFlags single_word{.single_word = true};
  EXPECT_EQ(flagged_parts("a<x>", single_word), (Parts{"a<x>"}));
  EXPECT_EQ(flagged_parts("<x>1", single_word), (Parts{"<x>1"}));
  EXPECT_EQ(flagged_parts("é<x>", single_word), (Parts{"é<x>"}));  // a letter beyond ASCII
  EXPECT_EQ(flagged_parts("<x>", single_word), (Parts{"#1"}));
  EXPECT_EQ(flagged_parts(" <x>.", single_word), (Parts{" ", "#1", "."}));
  EXPECT_EQ(flagged_parts("a<x> <x>", single_word), (Parts{"a<x> ", "#1"}));
  // Without the flag the same texts are cut.
  EXPECT_EQ(flagged_parts("a<x>1", {}), (Parts{"a", "#1", "1"}));
}

TEST(SpecialTokens, EmptyAndPlainText) {
  EXPECT_EQ(parts("", true), Parts{});
  EXPECT_EQ(parts("plain", true), (Parts{"plain"}));
}

}  // namespace
}  // namespace sieve::tok
