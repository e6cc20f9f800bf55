// Quest's decode-time read plan through the SparsityController seam: a fresh choice every R
// decode steps (the forced sink and window slices plus top_k by bounds), in between the last
// choice plus every slice started since; streams of other policies read everything.
#include <gtest/gtest.h>

#include <vector>

#include "sparsity/controller.h"
#include "sparsity/policy_spec.h"
#include "sparsity/selection.h"

namespace sieve::sparsity {
namespace {

constexpr int32_t kPageSize = 4;

// A one-layer controller whose prompt of `prompt_tokens` is compressed (Quest keeps every key).
SparsityController compressed(const std::string& policy, int64_t num_kv_heads,
                              int32_t prompt_tokens) {
  SparsityController controller(resolve(parse_policy(policy), {1, num_kv_heads}));
  std::vector<int32_t> num_keys(static_cast<size_t>(num_kv_heads), prompt_tokens);
  auto compression = controller.propose(
      {.prompt_done = true, .num_positions = prompt_tokens, .num_keys = num_keys});
  // Page selection needs streams of their own (the keys all stay).
  EXPECT_EQ(compression.changes_layout, controller.selects_pages());
  controller.commit(std::move(compression));
  return controller;
}

// One decode step: the read plan for the step that brings every stream to `num_keys`, then the
// step's outcome (the choosing rows' slices) back to the controller.
std::vector<std::optional<PageReads>> step(SparsityController& controller, int32_t num_keys,
                                           const std::vector<int32_t>& chosen) {
  const std::vector<int32_t> keys(controller.num_streams(), num_keys);
  std::vector<std::optional<PageReads>> reads = controller.decode_reads(keys, kPageSize);
  std::vector<std::vector<int32_t>> chosen_per_stream(controller.num_streams());
  for (size_t s = 0; s < reads.size(); ++s) {
    if (reads[s] && reads[s]->choose) chosen_per_stream[s] = chosen;
  }
  controller.after_decode_step(num_keys, keys, {}, chosen_per_stream, TokenClass::kOther);
  return reads;
}

TEST(PageReads, ChoiceIsReusedForRStepsWithTheSlicesStartedSince) {
  SparsityController controller = compressed("quest:K=3,R=3,S=4,W=4", 1, 30);
  EXPECT_TRUE(controller.selects_pages());
  EXPECT_TRUE(controller.acts_on_decode());
  // Step 0 (31 keys, slices 0..7): choose; the sinks' slice 0 and the window's slices 6, 7.
  auto reads = step(controller, 31, {0, 3, 7});
  ASSERT_TRUE(reads[0]);
  EXPECT_TRUE(reads[0]->choose);
  EXPECT_EQ(reads[0]->top_k, 3);
  EXPECT_EQ(reads[0]->forced,
            forced_pages(31, kPageSize,
                         {.top_k_pages = 3, .reuse_steps = 3, .num_sinks = 4, .window = 4}));
  // Steps 1 and 2 reuse it; key 32 (step 1) starts slice 8, which is read from then on.
  reads = step(controller, 32, {});
  ASSERT_TRUE(reads[0]);
  EXPECT_FALSE(reads[0]->choose);
  EXPECT_EQ(reads[0]->reuse, (std::vector<int32_t>{0, 3, 7}));
  reads = step(controller, 33, {});
  EXPECT_EQ(reads[0]->reuse, (std::vector<int32_t>{0, 3, 7, 8}));
  // Step 3 chooses again.
  reads = step(controller, 34, {0, 5, 8});
  EXPECT_TRUE(reads[0]->choose);
  reads = step(controller, 35, {});
  EXPECT_EQ(reads[0]->reuse, (std::vector<int32_t>{0, 5, 8}));
}

// B=1: every plan asks for summaries with key halves, reusing steps too (the summaries are kept
// from step to step, and a plan without them would have them rebuilt in the other layout).
TEST(PageReads, KeyHalvesAreAskedForOnEveryStep) {
  for (const char* policy : {"quest:K=3,R=2,S=4,W=4,B=1", "lserve:K=3,R=2,S=4,W=4,f=0,B=1"}) {
    SparsityController controller = compressed(policy, 1, 30);
    for (int32_t keys = 31; keys < 35; ++keys) {
      const auto reads = step(controller, keys, {0, 3, 7});
      ASSERT_TRUE(reads[0]) << policy;
      EXPECT_TRUE(reads[0]->key_halves) << policy << " at " << keys << " keys";
    }
  }
  SparsityController plain = compressed("quest:K=3,R=2,S=4,W=4", 1, 30);
  EXPECT_FALSE(step(plain, 31, {0, 3, 7})[0]->key_halves);
}

TEST(PageReads, AForkContinuesFromItsParentsChoice) {
  SparsityController parent = compressed("quest:K=2,R=4,S=4,W=4", 1, 16);
  step(parent, 17, {0, 4});
  SparsityController child(parent);
  EXPECT_EQ(step(child, 18, {})[0]->reuse, (std::vector<int32_t>{0, 4}));
}

TEST(PageReads, OnlyPageSelectingStreamsGetAPlanAndOnlyAfterThePrompt) {
  SparsityController before(resolve(parse_policy("quest:K=2,R=1"), {1, 2}));
  EXPECT_FALSE(before.decode_reads(std::vector<int32_t>{20, 20}, kPageSize)[0]);
  SparsityController dense = compressed("full", 2, 20);
  EXPECT_FALSE(dense.selects_pages());
  for (const auto& reads : dense.decode_reads(std::vector<int32_t>{21, 21}, kPageSize))
    EXPECT_FALSE(reads);
  SparsityController quest = compressed("quest:K=2,R=1", 2, 20);
  for (const auto& reads : quest.decode_reads(std::vector<int32_t>{21, 21}, kPageSize)) {
    ASSERT_TRUE(reads);
    EXPECT_TRUE(reads->choose);
  }
}

}  // namespace
}  // namespace sieve::sparsity
