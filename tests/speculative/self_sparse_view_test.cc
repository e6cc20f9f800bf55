#include "speculative/self_sparse_view.h"

#include <gtest/gtest.h>

#include <string>

#include "util/error.h"

namespace sieve::speculative {
namespace {

std::string refusal(const char* policy) {
  try {
    check_draft_policy(sparsity::parse_policy(policy));
  } catch (const Error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(SelfSparseView, StreamingAndQuestWithR1AreTheDraftViews) {
  EXPECT_EQ(refusal("streaming:S=4,W=1020"), "accepted");
  EXPECT_EQ(refusal("quest:K=64"), "accepted");
  EXPECT_EQ(refusal("quest:K=8,R=1,S=16,W=64"), "accepted");
  // A draft row chooses its pages each pass; Quest's reuse across steps has no meaning there.
  EXPECT_NE(refusal("quest:K=8,R=4").find("R=1"), std::string::npos);
  for (const char* other : {"full", "snapkv:B=64", "lserve:K=8,f=0", "h2o:B=16"}) {
    const std::string message = refusal(other);
    EXPECT_NE(message.find("quest:K="), std::string::npos) << other << ": " << message;
    EXPECT_NE(message.find("streaming:S="), std::string::npos) << other << ": " << message;
  }
}

// Page size 16; position 100 is block 6.
TEST(SelfSparseView, StreamingReadsSinkAndWindowBlocks) {
  const DraftView view = draft_view(sparsity::parse_policy("streaming:S=4,W=20"), 100, 16);
  EXPECT_EQ(view.blocks, (std::vector<int32_t>{0, 5, 6}));  // positions 81..100: blocks 5, 6
  EXPECT_FALSE(view.choice.has_value());
  // Early on, the sink block is the row's own block and comes once.
  EXPECT_EQ(draft_view(sparsity::parse_policy("streaming:S=4,W=20"), 3, 16).blocks,
            (std::vector<int32_t>{0}));
}

TEST(SelfSparseView, QuestOffersEveryBlockAndForcesSinksAndWindow) {
  const DraftView view = draft_view(sparsity::parse_policy("quest:K=4,S=4,W=20"), 100, 16);
  EXPECT_EQ(view.blocks, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6}));
  ASSERT_TRUE(view.choice.has_value());
  EXPECT_EQ(view.choice->top_k, 4);
  // 101 keys: the sink in block 0, positions 81..100 in blocks 5 and 6.
  EXPECT_EQ(view.choice->forced, (std::vector<int32_t>{0, 5, 6}));
  const DraftView first = draft_view(sparsity::parse_policy("quest:K=4,S=1,W=1"), 0, 16);
  EXPECT_EQ(first.blocks, (std::vector<int32_t>{0}));
  EXPECT_EQ(first.choice->forced, (std::vector<int32_t>{0}));
}

}  // namespace
}  // namespace sieve::speculative
