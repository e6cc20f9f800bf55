#include "speculative/step_cost.h"

#include <gtest/gtest.h>

namespace sieve::speculative {
namespace {

TEST(StepCost, PriorUntilADraftPassAndAStepWereTimed) {
  StepCost cost;
  EXPECT_DOUBLE_EQ(cost.draft_token_cost(Method::kSelfSparse, 1), StepCost::kPriorCost);
  cost.record_draft_pass(Method::kSelfSparse, 1, 0.001);
  EXPECT_DOUBLE_EQ(cost.draft_token_cost(Method::kSelfSparse, 1), StepCost::kPriorCost);
  cost.record_step(1, 1, 0.010);
  EXPECT_NE(cost.draft_token_cost(Method::kSelfSparse, 1), StepCost::kPriorCost);
  // Another method's passes are its own.
  EXPECT_DOUBLE_EQ(cost.draft_token_cost(Method::kDraftModel, 1), StepCost::kPriorCost);
}

// Steps of a + b * tokens seconds: the fit finds a and b, and c = (pass per row + b) over a
// plain step's time per sequence, (a + b * n) / n.
TEST(StepCost, FitsTheStepTimeAndWeighsADraftTokenAgainstAPlainToken) {
  const double a = 0.008, b = 0.0005, pass = 0.002;
  StepCost cost;
  for (int i = 0; i < 40; ++i) {
    const int64_t tokens = 1 + i % 5;  // k from 0 to 4: steps of different sizes
    cost.record_step(tokens, 1, a + b * static_cast<double>(tokens));
    cost.record_draft_pass(Method::kSelfSparse, 2, 2 * pass);
  }
  EXPECT_NEAR(cost.draft_token_cost(Method::kSelfSparse, 1), (pass + b) / (a + b), 1e-9);
  EXPECT_NEAR(cost.draft_token_cost(Method::kSelfSparse, 4), (pass + b) / ((a + 4 * b) / 4), 1e-9);
  // Prompt lookup drafts for free: only the verification row counts.
  EXPECT_NEAR(cost.draft_token_cost(Method::kNgram, 1), b / (a + b), 1e-9);
}

// A batch whose steps cost per token (compute-bound: a ~ 0): a verified draft token costs as
// much as a plain one, so even free drafts do not pay (c >= 1); one sequence whose step is
// mostly its fixed part: they do.
TEST(StepCost, BatchedComputeBoundDecodeMakesDraftsDear) {
  StepCost batched;
  for (int i = 0; i < 40; ++i) {
    const int64_t tokens = 16 + 4 * (i % 5);
    batched.record_step(tokens, 16, 0.0001 + 0.001 * static_cast<double>(tokens));
  }
  EXPECT_GT(batched.draft_token_cost(Method::kNgram, 16), 0.98);
  StepCost single;
  for (int i = 0; i < 40; ++i) {
    const int64_t tokens = 1 + i % 5;
    single.record_step(tokens, 1, 0.010 + 0.0002 * static_cast<double>(tokens));
  }
  EXPECT_LT(single.draft_token_cost(Method::kNgram, 1), 0.05);
}

TEST(StepCost, DraftPassAsDearAsAStepCostsMoreThanAStepPerToken) {
  StepCost cost;
  for (int i = 0; i < 8; ++i) {
    cost.record_step(2, 1, 0.010);  // one size only: b is the prior share of the step
    cost.record_draft_pass(Method::kSelfSparse, 1, 0.010);
  }
  EXPECT_GT(cost.draft_token_cost(Method::kSelfSparse, 1), 1.0);
}

TEST(StepCost, FollowsAChangeWithinItsMemory) {
  StepCost cost;
  for (int i = 0; i < 64; ++i) {
    cost.record_step(1 + i % 3, 1, 0.010);
    cost.record_draft_pass(Method::kDraftModel, 1, 0.010);
  }
  const double dear = cost.draft_token_cost(Method::kDraftModel, 1);
  for (int i = 0; i < 4 * static_cast<int>(StepCost::kMemorySteps); ++i)
    cost.record_draft_pass(Method::kDraftModel, 1, 0.001);
  const double cheap = cost.draft_token_cost(Method::kDraftModel, 1);
  EXPECT_GT(dear, 0.9);
  EXPECT_LT(cheap, 0.2);
}

}  // namespace
}  // namespace sieve::speculative
