// Random grammars, random walks through their masks: the text a walk ends with is a sentence of
// the grammar, every chosen token is accepted, the mask is never empty (a dead end would show as
// an empty mask: random_walk checks each step), and sampled masks equal the brute force. Both
// the walks' texts and the masks are also judged by an independent reading of the dialect
// (reference_grammar.h: the grammar parsed and matched the simple, slow way, no code shared).
// SIEVE_GRAMMAR_FUZZ=N runs N times as many grammars.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/grammar.h"
#include "reference_grammar.h"
#include "test_util.h"
#include "util/error.h"

namespace sieve::grammar {
namespace {

class GrammarGenerator {
 public:
  explicit GrammarGenerator(uint32_t seed) : rng_(seed) {}

  std::string generate() {
    const int num_rules = pick(1, 4);
    std::string out;
    for (int r = 0; r < num_rules; ++r) {
      out += (r == 0 ? std::string("root") : "r" + std::to_string(r)) + " ::= ";
      out += alternatives(num_rules, 0) + "\n";
    }
    return out;
  }

 private:
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  std::string alternatives(int num_rules, int depth) {
    std::string out;
    const int n = pick(1, 3);
    for (int a = 0; a < n; ++a) {
      if (a > 0) out += " | ";
      const int items = pick(depth == 0 ? 1 : 0, 3);
      for (int i = 0; i < items; ++i) out += " " + item(num_rules, depth);
    }
    return out;
  }

  std::string item(int num_rules, int depth) {
    static const char* const kAtoms[] = {
        "\"a\"", "\"b\"", "\"ab\"", "\"the\"", "\" \"", "\"é\"", "\"😀\"", "\"\\n\"",
        "\"{\"", "[a-c]", "[^a]",   "[é-ü]",   "[0-9]", ".",     "[😀-🙏]", "\"\\u00e9x\""};
    std::string atom;
    const int kind = pick(0, 9);
    // Repeating a rule or a group that may itself repeat makes ambiguous grammars whose parses
    // multiply with every character (refused as too ambiguous); keep those to `?`.
    static const char* const kPostfixOfRule[] = {"", "", "?"};
    if (kind <= 5) {
      atom = kAtoms[pick(0, static_cast<int>(std::size(kAtoms)) - 1)];
    } else if (kind <= 7 && num_rules > 1) {
      atom = "r" + std::to_string(pick(1, num_rules - 1));
    } else if (depth < 2) {
      atom = "(" + alternatives(num_rules, depth + 1) + " )";
    } else {
      atom = "\"z\"";
    }
    static const char* const kPostfix[] = {"", "", "", "*", "+", "?", "{1,3}", "{2}", "{0,2}"};
    if (kind > 5) return atom + kPostfixOfRule[pick(0, 2)];
    return atom + kPostfix[pick(0, static_cast<int>(std::size(kPostfix)) - 1)];
  }

  std::mt19937 rng_;
};

TEST(GrammarFuzz, RandomGrammarsRandomWalks) {
  int num_grammars = 0;
  int num_refused = 0;
  int num_ended = 0;
  int num_ambiguous = 0;  // refused while running: more than kMaxStacks parses
  int num_judged = 0;     // tokens the reference judged against a mask
  int num_judged_refused = 0;
  const int target = 20 * testing::fuzz_scale();
  for (uint32_t seed = 1; num_grammars < target; ++seed) {
    const std::string text = GrammarGenerator(seed).generate();
    std::shared_ptr<const CompiledGrammar> grammar;
    try {
      grammar = CompiledGrammar::from_gbnf(text);
    } catch (const Error&) {
      ++num_refused;  // left recursion or never finishing: refused, which is fine
      continue;
    }
    ++num_grammars;
    const char* vocab_name = testing::kVocabularies[seed % 2];
    SCOPED_TRACE(std::string(vocab_name) + " seed " + std::to_string(seed) + "\n" + text);
    const auto vocab = testing::golden_vocabulary(vocab_name);
    const TokenMasker masker(grammar, vocab, MaskerOptions{.context_depth = 1 + seed % 3});
    const reference::Grammar judge(text);
    std::mt19937 rng(seed);
    bool ambiguous = false;
    for (int walk = 0; walk < 3 && !ambiguous; ++walk) {
      testing::WalkResult result;
      try {
        result = testing::random_walk(masker, rng, 60, 30, "", 0.25);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
        ++num_ambiguous;
        ambiguous = true;
        break;
      }
      GrammarState check(grammar);
      ASSERT_TRUE(check.accept_bytes(result.text)) << result.text;
      EXPECT_TRUE(judge.accepts_prefix(result.text)) << result.text;
      if (result.ended) {
        ++num_ended;
        EXPECT_TRUE(check.can_end()) << result.text;
        EXPECT_TRUE(judge.accepts(result.text)) << result.text;
      }
    }
    if (ambiguous) continue;
    // One mask at a random prefix against the brute force.
    GrammarState state(grammar);
    TokenBitset mask;
    std::string prefix;
    for (int step = 0; step < static_cast<int>(seed % 7); ++step) {
      masker.fill_mask(state, mask);
      std::vector<TokenId> ids = testing::allowed_ids(mask);
      std::erase_if(ids, [&](TokenId id) { return vocab->is_eog(id); });
      if (ids.empty()) break;
      const TokenId id = ids[rng() % ids.size()];
      ASSERT_TRUE(masker.accept_token(state, id));
      prefix += vocab->token_bytes(id);
    }
    masker.fill_mask(state, mask);
    EXPECT_EQ(mask, testing::brute_force_mask(*vocab, state));
    // The reference on sampled tokens, allowed and not (those that leave the text mid-character
    // are skipped: the reference reads whole characters).
    const bool whole_prefix = reference::decode_utf8(prefix).has_value();
    for (int k = 0; k < 200 && whole_prefix; ++k) {
      const auto id = static_cast<TokenId>(rng() % vocab->size());
      if (vocab->is_eog(id)) {
        EXPECT_EQ(mask.test(id), judge.accepts(prefix)) << "EOG after '" << prefix << "'";
        continue;
      }
      if (!vocab->is_text(id)) continue;
      const std::string next = prefix + std::string(vocab->token_bytes(id));
      if (!reference::decode_utf8(next)) continue;
      ++num_judged;
      num_judged_refused += !mask.test(id);
      EXPECT_EQ(mask.test(id), judge.accepts_prefix(next))
          << "'" << prefix << "' + '" << vocab->token_bytes(id) << "'";
    }
    const std::vector<TokenId> allowed = testing::allowed_ids(mask);  // allowed ones, too
    for (int k = 0; k < 300 && whole_prefix && !allowed.empty(); ++k) {
      const TokenId id = allowed[rng() % allowed.size()];
      if (vocab->is_eog(id)) continue;
      const std::string next = prefix + std::string(vocab->token_bytes(id));
      if (!reference::decode_utf8(next)) continue;
      ++num_judged;
      EXPECT_TRUE(judge.accepts_prefix(next))
          << "'" << prefix << "' + '" << vocab->token_bytes(id) << "'";
    }
  }
  EXPECT_GT(num_ended, num_grammars);  // most walks end
  EXPECT_LT(num_ambiguous, num_grammars / 4);
  EXPECT_GT(num_judged, 100 * num_grammars);
  EXPECT_GT(num_judged_refused, 10 * num_grammars) << "the reference must see refused tokens too";
  std::printf(
      "%d grammars walked, %d refused, %d too ambiguous, %d walks ended, %d tokens judged by the "
      "reference\n",
      num_grammars, num_refused, num_ambiguous, num_ended, num_judged);
}

}  // namespace
}  // namespace sieve::grammar
