#include "spec/draft_length.h"

#include <gtest/gtest.h>

namespace sieve::spec {
namespace {

TEST(DraftLength, BestLengthGrowsWithAcceptanceAndStaysInRange) {
  const double c = DraftLength::kDraftTokenCost;
  EXPECT_EQ(DraftLength::best_length(0.0, c, 8), 1);
  EXPECT_EQ(DraftLength::best_length(0.5, c, 8), 1);
  EXPECT_EQ(DraftLength::best_length(0.6, c, 8), 2);
  EXPECT_EQ(DraftLength::best_length(0.8, c, 8), 4);
  EXPECT_EQ(DraftLength::best_length(0.9, c, 8), 7);
  EXPECT_EQ(DraftLength::best_length(0.9, c, 3), 3);
  EXPECT_EQ(DraftLength::best_length(1.0, c, 16), 16);
  EXPECT_EQ(DraftLength::best_length(1.0, c, 1), 1);
  // Free drafts: as long as allowed, whatever the acceptance above 0.
  EXPECT_EQ(DraftLength::best_length(0.3, 0.0, 6), 6);
}

TEST(DraftLength, FollowsTheSequencesRecentAcceptance) {
  DraftLength k(8);
  EXPECT_EQ(k.next(), 4);                                    // the prior: acceptance 0.8
  for (int i = 0; i < 6; ++i) k.record(k.next(), k.next());  // everything accepted
  EXPECT_EQ(k.next(), 8);
  EXPECT_GT(k.acceptance(), 0.95);
  k.record(k.next(), 0);  // the first draft token rejected
  EXPECT_EQ(k.next(), 6);
  for (int i = 0; i < 7; ++i) k.record(k.next(), 0);
  EXPECT_EQ(k.next(), 1);
  k.record(0, 0);  // no draft: nothing learnt
  EXPECT_EQ(k.next(), 1);
  for (int i = 0; i < 10; ++i) k.record(k.next(), k.next());
  EXPECT_EQ(k.next(), 8);
  DraftLength one(1);
  one.record(1, 1);
  EXPECT_EQ(one.next(), 1);
}

}  // namespace
}  // namespace sieve::spec
