#include "speculative/draft_length.h"

#include <gtest/gtest.h>

namespace sieve::speculative {
namespace {

constexpr double kCost = 0.2;

TEST(DraftLength, BestLengthGrowsWithAcceptanceAndStaysInRange) {
  EXPECT_EQ(DraftLength::best_length(0.0, kCost, 8), 0);
  EXPECT_EQ(DraftLength::best_length(0.2, kCost, 8), 0);
  EXPECT_EQ(DraftLength::best_length(0.3, kCost, 8), 1);
  EXPECT_EQ(DraftLength::best_length(0.5, kCost, 8), 1);
  EXPECT_EQ(DraftLength::best_length(0.6, kCost, 8), 2);
  EXPECT_EQ(DraftLength::best_length(0.8, kCost, 8), 4);
  EXPECT_EQ(DraftLength::best_length(0.9, kCost, 8), 7);
  EXPECT_EQ(DraftLength::best_length(0.9, kCost, 3), 3);
  EXPECT_EQ(DraftLength::best_length(1.0, kCost, 16), 16);
  EXPECT_EQ(DraftLength::best_length(1.0, kCost, 1), 1);
  // Free drafts: as long as allowed, whatever the acceptance above 0.
  EXPECT_EQ(DraftLength::best_length(0.3, 0.0, 6), 6);
  // A draft token costing a whole step never pays, even always accepted.
  EXPECT_EQ(DraftLength::best_length(1.0, 1.0, 8), 0);
  EXPECT_EQ(DraftLength::best_length(0.9, 0.5, 8), 3);
}

TEST(DraftLength, FollowsTheSequencesRecentAcceptance) {
  DraftLength k(8);
  EXPECT_EQ(k.next(kCost), 4);  // the prior: acceptance 0.8
  for (int i = 0; i < 6; ++i) {
    const int32_t drafted = k.next(kCost);
    k.record(drafted, drafted);  // everything accepted
  }
  EXPECT_EQ(k.next(kCost), 8);
  EXPECT_GT(k.acceptance(), 0.95);
  k.record(8, 0);  // the first draft token rejected
  EXPECT_EQ(k.next(kCost), 6);
  for (int i = 0; i < 7; ++i) k.record(k.next(kCost), 0);
  EXPECT_EQ(k.next(kCost), 1);
  k.record(0, 0);  // no draft: nothing learnt
  EXPECT_EQ(k.next(kCost), 1);
  for (int i = 0; i < 10; ++i) {
    const int32_t drafted = k.next(kCost);
    k.record(drafted, drafted);
  }
  EXPECT_EQ(k.next(kCost), 8);
  DraftLength one(1);
  one.record(1, 1);
  EXPECT_EQ(one.next(kCost), 1);
}

// Where drafts do not pay, the sequence decodes plainly but drafts one token every
// kProbeInterval steps, and goes back to drafting when they pay again (cheaper, or accepted).
TEST(DraftLength, TurnsItselfOffWhenDraftsDoNotPayAndProbes) {
  DraftLength k(8);
  for (int step = 0; step < 4 * DraftLength::kProbeInterval; ++step)
    EXPECT_EQ(k.next(/*cost=*/1.0), 0) << "no acceptance pays at c = 1: no probes";
  EXPECT_EQ(k.next(kCost), 4);  // cheap again: drafts at once

  DraftLength dear(8);
  int drafted_steps = 0;
  for (int step = 0; step < 4 * DraftLength::kProbeInterval; ++step) {
    const int32_t n = dear.next(/*cost=*/0.9);  // pays only near acceptance 1
    EXPECT_LE(n, 1);
    if (n > 0) {
      ++drafted_steps;
      dear.record(n, 0);
    }
  }
  EXPECT_EQ(drafted_steps, 4);

  DraftLength rejected(8);
  for (int i = 0; i < 20; ++i) rejected.record(4, 0);
  int plain_steps = 0;  // before the probe, which is the kProbeInterval-th step
  while (rejected.next(kCost) == 0) ++plain_steps;
  EXPECT_EQ(plain_steps, DraftLength::kProbeInterval - 1);
  for (int i = 0; i < 20; ++i) rejected.record(1, 1);  // the probes hold: k climbs
  EXPECT_GE(rejected.next(kCost), 4);
}

}  // namespace
}  // namespace sieve::speculative
