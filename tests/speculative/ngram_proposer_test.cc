#include "speculative/ngram_proposer.h"

#include <gtest/gtest.h>

namespace sieve::speculative {
namespace {

using Tokens = std::vector<int32_t>;

TEST(NgramProposer, ContinuesTheLatestEarlierOccurrenceOfTheLongestSuffix) {
  // "1 2 3" occurs twice before the end; the latest one (followed by 7 8) wins.
  const Tokens tokens = {1, 2, 3, 4, 5, 1, 2, 3, 7, 8, 9, 1, 2, 3};
  EXPECT_EQ(propose_ngram(tokens, 1, 3, 2), (Tokens{7, 8}));
  EXPECT_EQ(propose_ngram(tokens, 1, 3, 10), (Tokens{7, 8, 9, 1, 2, 3}));
}

TEST(NgramProposer, FallsBackToShorterSuffixesDownToTheMinimum) {
  const Tokens tokens = {5, 6, 9, 4, 8, 6};  // "8 6" never occurred before; "6" did
  EXPECT_EQ(propose_ngram(tokens, 1, 3, 3), (Tokens{9, 4, 8}));
  EXPECT_TRUE(propose_ngram(tokens, 2, 3, 3).empty());
}

TEST(NgramProposer, NoMatchOrNoRoomGivesAnEmptyDraft) {
  EXPECT_TRUE(propose_ngram(Tokens{1, 2, 3, 4}, 1, 4, 4).empty());
  EXPECT_TRUE(propose_ngram(Tokens{1, 1}, 1, 4, 0).empty());
  EXPECT_TRUE(propose_ngram(Tokens{7}, 1, 4, 4).empty());
  // A run of one token drafts more of it.
  EXPECT_EQ(propose_ngram(Tokens{3, 3, 3}, 1, 4, 4), (Tokens{3}));
}

}  // namespace
}  // namespace sieve::speculative
