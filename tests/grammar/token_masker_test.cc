#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/token_masker.h"
#include "test_util.h"

namespace sieve::grammar {
namespace {

using testing::brute_force_mask;
using testing::golden_vocabulary;
using testing::kVocabularies;

const char* const kJsonish = R"(
root   ::= object
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( string ws ":" ws value ws ( "," ws string ws ":" ws value ws )* )? "}"
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws     ::= [ \t\n]{0,8}
)";

const char* const kUnicode = R"(
root ::= ( "name: " [^\n]{1,20} "\n" | "emoji: " [😀-🙏]+ "\n" | "greek: " [α-ω ]+ "\n" )+
)";

const char* const kWords = R"(
root ::= sentence ("." " " sentence)* "."
sentence ::= word (" " word){0,6}
word ::= [A-Za-z]+ | "the" | "of" | "'s"
)";

struct MaskCase {
  const char* grammar;
  uint32_t context_depth;
};

// Fast mask == brute force at states reached by random valid prefixes.
TEST(TokenMasker, MasksEqualBruteForceOnRealVocabularies) {
  const MaskCase cases[] = {{kJsonish, 3}, {kJsonish, 1}, {kUnicode, 3}, {kWords, 2}};
  for (const char* name : kVocabularies) {
    const auto vocab = golden_vocabulary(name);
    for (const MaskCase& c : cases) {
      SCOPED_TRACE(std::string(name) + " depth " + std::to_string(c.context_depth) + c.grammar);
      const auto grammar = CompiledGrammar::from_gbnf(c.grammar);
      const TokenMasker masker(grammar, vocab, MaskerOptions{.context_depth = c.context_depth});
      std::mt19937 rng(7);
      const int num_walks = 2 * testing::fuzz_scale();
      for (int walk = 0; walk < num_walks; ++walk) {
        GrammarState state = masker.new_state();
        TokenBitset mask;
        for (int step = 0; step < 40; ++step) {
          masker.fill_mask(state, mask);
          if (step % 13 == walk % 13 || step < 1) {
            ASSERT_EQ(mask, brute_force_mask(*vocab, state)) << "step " << step;
          }
          std::vector<TokenId> ids = testing::allowed_ids(mask);
          std::erase_if(ids, [&](TokenId id) { return vocab->is_eog(id); });
          if (ids.empty()) break;
          const TokenId id = ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
          ASSERT_TRUE(masker.accept_token(state, id));
        }
      }
    }
  }
}

TEST(TokenMasker, SpecialTokensNeverAndEosOnlyAtTheEnd) {
  for (const char* name : kVocabularies) {
    const auto vocab = golden_vocabulary(name);
    const TokenMasker masker(CompiledGrammar::from_gbnf(R"(root ::= "ab" "c"?)"), vocab);
    GrammarState state = masker.new_state();
    TokenBitset mask;
    masker.fill_mask(state, mask);
    for (TokenId id : vocab->eog_ids()) EXPECT_FALSE(mask.test(static_cast<size_t>(id)));
    EXPECT_FALSE(masker.accept_token(state, vocab->eog_ids()[0]));
    ASSERT_TRUE(state.accept_bytes("ab"));
    masker.fill_mask(state, mask);
    for (TokenId id : vocab->eog_ids()) EXPECT_TRUE(mask.test(static_cast<size_t>(id)));
    EXPECT_TRUE(masker.accept_token(state, vocab->eog_ids()[0]));
    for (size_t i = 0; i < vocab->size(); ++i) {
      const auto id = static_cast<TokenId>(i);
      if (!vocab->is_text(id) && !vocab->is_eog(id)) {
        EXPECT_FALSE(mask.test(i)) << id;
        EXPECT_FALSE(masker.accept_token(state, id));
      }
    }
  }
}

// A token that ends inside a multi-byte character leaves a partial character the next token
// must complete; SentencePiece spells such characters with <0xHH> byte tokens.
TEST(TokenMasker, PartialCharactersAcrossTokens) {
  const auto vocab = golden_vocabulary("llama-spm");
  const TokenMasker masker(CompiledGrammar::from_gbnf(R"(root ::= "x" [😀-😃] "y")"), vocab);
  GrammarState state = masker.new_state();
  ASSERT_TRUE(state.accept_bytes("x"));
  TokenBitset mask;
  masker.fill_mask(state, mask);
  // Only the byte token <0xF0> can start 😀 (U+1F600 = F0 9F 98 80) in this vocabulary.
  const std::vector<TokenId> ids = testing::allowed_ids(mask);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_EQ(vocab->token_bytes(ids[0]), "\xF0");
  ASSERT_TRUE(masker.accept_token(state, ids[0]));
  EXPECT_TRUE(state.in_partial_char());
  masker.fill_mask(state, mask);
  EXPECT_EQ(mask, brute_force_mask(*vocab, state));
  ASSERT_EQ(mask.count(), 1u);  // 0x9F
  ASSERT_TRUE(state.accept_bytes("\x9F\x98"));
  masker.fill_mask(state, mask);
  EXPECT_EQ(mask.count(), 4u);  // 0x80..0x83
  EXPECT_EQ(mask, brute_force_mask(*vocab, state));
}

}  // namespace
}  // namespace sieve::grammar
