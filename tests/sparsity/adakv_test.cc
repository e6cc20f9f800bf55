// Ada-KV (adakv:B=,W=,P=,pool=,alpha=): its grammar, its resolution to shared-budget heads, and
// the budget it shares among a layer's KV heads, through the SparsityController seam.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <vector>

#include "sparsity/controller.h"
#include "sparsity/policy_spec.h"
#include "sparsity/selection.h"
#include "util/error.h"

namespace sieve::sparsity {
namespace {

TEST(AdaKvSpec, ParsesPrintsAndRoundTrips) {
  EXPECT_EQ(parse_policy("adakv:B=64,W=8,P=3,pool=avg,alpha=0.5"),
            (PolicySpec{AdaKvSpec{SnapKvSpec{64, 8, 3, Pooling::kAvg}, 0.5}}));
  const PolicySpec defaults = parse_policy("adakv:B=64");
  EXPECT_EQ(defaults, (PolicySpec{AdaKvSpec{SnapKvSpec{64, 32, 7, Pooling::kMax}, 0.2}}));
  EXPECT_EQ(to_string(defaults), "adakv:B=64,W=32,P=7,pool=max,alpha=0.2");
  EXPECT_EQ(parse_policy(to_string(defaults)), defaults);
  EXPECT_EQ(parse_policy_json(to_json(defaults)), defaults);
  EXPECT_EQ(parse_policy("layerwise:L=1,rest=adakv:B=16,W=4"),
            parse_policy(to_string(parse_policy("layerwise:L=1,rest=adakv:B=16,W=4"))));
}

TEST(AdaKvSpec, RefusesBadParametersNamingThem) {
  for (const char* bad : {"adakv", "adakv:B=0", "adakv:B=8,alpha=1.5", "adakv:B=8,P=2"}) {
    try {
      parse_policy(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("adakv"), std::string::npos) << e.what();
    }
  }
}

TEST(AdaKvSpec, ResolvesToOneSharedBudgetHeadPerStream) {
  const SparsityPlan plan = resolve(parse_policy("layerwise:L=1,rest=adakv:B=16,W=4"), {3, 2});
  EXPECT_TRUE(std::holds_alternative<DenseHead>(plan.at(0, 1)));
  EXPECT_EQ(plan.at(2, 1),
            (HeadPolicy{SharedBudgetHead{SnapKvSpec{16, 4, 7, Pooling::kMax}, 0.2}}));
  EXPECT_EQ(SparsityController(plan).observation_rows(), 4);
}

// Prompt compression of one layer of `scores.size()` KV heads (each with scores.size() keys).
SparsityController::Compression compress(const std::string& policy,
                                         const std::vector<std::vector<float>>& scores) {
  const auto heads = static_cast<int64_t>(scores.size());
  SparsityController controller(resolve(parse_policy(policy), {1, heads}));
  std::vector<int32_t> num_keys;
  std::vector<std::span<const float>> spans;
  for (const auto& s : scores) {
    num_keys.push_back(static_cast<int32_t>(s.size()));
    spans.emplace_back(s);
  }
  return controller.propose(
      {.prompt_done = true, .num_positions = num_keys[0], .num_keys = num_keys, .scores = spans});
}

std::vector<int32_t> range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

TEST(AdaKv, AConcentratedHeadLeavesItsBudgetToASpreadOne) {
  // 12 keys per head, window 2: 10 candidates each, 2 x 4 = 8 to share. Head 0 puts its mass
  // on three keys, head 1 spreads it evenly.
  std::vector<float> concentrated(12, 0.01f), spread(12, 1.0f);
  concentrated[2] = 10.0f;
  concentrated[5] = 9.0f;
  concentrated[7] = 8.0f;
  const auto c = compress("adakv:B=4,W=2,P=1,alpha=0", {concentrated, spread});
  std::vector<int32_t> head0 = {2, 5, 7, 10, 11};
  std::vector<int32_t> head1 = range(0, 5);  // ties: the lower index first
  head1.push_back(10);
  head1.push_back(11);
  ASSERT_TRUE(c.keep[0] && c.keep[1]);
  EXPECT_EQ(*c.keep[0], head0);
  EXPECT_EQ(*c.keep[1], head1);
  // SnapKV gives each head 4: head 0 keeps a useless key, head 1 one key fewer.
  const auto s = compress("snapkv:B=4,W=2,P=1", {concentrated, spread});
  EXPECT_EQ(s.keep[0]->size(), 6u);
  EXPECT_EQ(s.keep[1]->size(), 6u);
  ASSERT_TRUE(c.attention_recovery && s.attention_recovery);
  EXPECT_GT(*c.attention_recovery, *s.attention_recovery);
}

TEST(AdaKv, EveryHeadKeepsItsFloor) {
  std::vector<float> strong(12, 5.0f), weak(12, 0.1f);
  // alpha = 0.5 of B = 4: the weak head keeps its best 2 although the strong head outranks it.
  const auto c = compress("adakv:B=4,W=2,P=1,alpha=0.5", {strong, weak});
  EXPECT_EQ(*c.keep[0], (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 10, 11}));
  EXPECT_EQ(*c.keep[1], (std::vector<int32_t>{0, 1, 10, 11}));
}

TEST(AdaKv, KeepsEverythingWhenTheLayerFitsItsBudget) {
  const std::vector<float> a(6, 1.0f), b(9, 2.0f);  // 4 + 7 candidates <= 2 x 6
  const auto c = compress("adakv:B=6,W=2,P=1", {a, b});
  EXPECT_EQ(*c.keep[0], range(0, 6));
  EXPECT_EQ(*c.keep[1], range(0, 9));
}

TEST(AdaKv, KeepsAtLeastAsMuchAttentionAsSnapKvOnRandomHeads) {
  // Without pooling and floors the shared top-k maximises the layer's kept mass.
  std::mt19937 rng(7);
  std::gamma_distribution<float> mass(0.3f, 1.0f);  // skewed, as attention is
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::vector<float>> scores(4, std::vector<float>(40));
    for (auto& head : scores)
      for (float& s : head) s = mass(rng);
    const auto ada = compress("adakv:B=8,W=4,P=1,alpha=0", scores);
    const auto snap = compress("snapkv:B=8,W=4,P=1", scores);
    double kept_ada = 0, kept_snap = 0;
    size_t total_ada = 0;
    for (size_t h = 0; h < scores.size(); ++h) {
      for (int32_t i : *ada.keep[h]) kept_ada += scores[h][i];
      for (int32_t i : *snap.keep[h]) kept_snap += scores[h][i];
      total_ada += ada.keep[h]->size();
    }
    EXPECT_EQ(total_ada, 4u * (8 + 4)) << "the layer keeps exactly its shared budget";
    EXPECT_GE(kept_ada, kept_snap - 1e-4) << "trial " << trial;
  }
}

}  // namespace
}  // namespace sieve::sparsity
