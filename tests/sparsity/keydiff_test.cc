// KeyDiff (keydiff:B=,W=): its grammar, the keys it keeps (the least similar to the mean key,
// by cosine) through the SparsityController seam, and Ada-KV / PyramidKV over its scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "sparsity/controller.h"
#include "sparsity/policy_spec.h"
#include "util/error.h"

namespace sieve::sparsity {
namespace {

TEST(KeyDiffSpec, ParsesPrintsAndWrapsUnderAdaKvAndPyramidKv) {
  EXPECT_EQ(parse_policy("keydiff:B=64"), (PolicySpec{KeyDiffSpec{64, 32}}));
  EXPECT_EQ(to_string(parse_policy("keydiff:W=0,B=8")), "keydiff:B=8,W=0");
  EXPECT_EQ(to_json(parse_policy("keydiff:B=8")), R"({"B":8,"W":32,"name":"keydiff"})");
  const PolicySpec ada = parse_policy("adakv:B=16,W=4,score=keydiff");
  EXPECT_EQ(ada, (PolicySpec{AdaKvSpec{KeyDiffSpec{16, 4}, 0.2}}));
  EXPECT_EQ(to_string(ada), "adakv:B=16,W=4,alpha=0.2,score=keydiff");
  EXPECT_EQ(to_json(ada), R"({"B":16,"W":4,"alpha":0.2,"name":"adakv","score":"keydiff"})");
  EXPECT_EQ(parse_policy_json(to_json(ada)), ada);
  EXPECT_EQ(parse_policy(to_string(ada)), ada);
  const PolicySpec pyramid = parse_policy("pyramidkv:B=100,W=8,beta=2,score=keydiff");
  EXPECT_EQ(to_string(pyramid), "pyramidkv:B=100,W=8,beta=2,score=keydiff");
  // Its per-layer heads are KeyDiff heads with their layer's budget.
  const SparsityPlan plan = resolve(pyramid, {2, 1});
  EXPECT_EQ(plan.at(0, 0), HeadPolicy(KeyDissimilarHead{150, 8}));
  EXPECT_EQ(plan.at(1, 0), HeadPolicy(KeyDissimilarHead{50, 8}));
  EXPECT_EQ(policy_for_budget("keydiff", {.keep_tokens = 64, .window = 8, .page_size = 16}),
            "keydiff:B=56,W=8");

  for (const auto& [bad, expected] : std::vector<std::pair<std::string, std::string>>{
           {"keydiff", "missing B"},
           {"keydiff:B=0", "B must be >= 1"},
           {"keydiff:B=4,P=3", "unknown parameter \"P\" (expected B, W)"},
           {"adakv:B=4,score=keydiff,pool=max", "unknown parameter \"pool\""},
           {"adakv:B=4,score=nope", "score must be one of snapkv, keydiff"},
       }) {
    try {
      parse_policy(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }
}

// keys[s]: stream s's [n][head_dim] keys; all streams hold n keys.
SparsityController::Compression compress(const std::string& policy, int64_t num_kv_heads,
                                         const std::vector<std::vector<float>>& keys,
                                         int32_t head_dim) {
  SparsityController controller(resolve(parse_policy(policy), {1, num_kv_heads}));
  EXPECT_TRUE(controller.needs_keys());
  EXPECT_EQ(controller.observation_rows(), 0);  // no attention scores
  const auto n = static_cast<int32_t>(keys[0].size() / static_cast<size_t>(head_dim));
  const std::vector<int32_t> num_keys(keys.size(), n);
  std::vector<std::span<const float>> spans(keys.begin(), keys.end());
  return controller.propose({.prompt_done = true,
                             .num_positions = n,
                             .num_keys = num_keys,
                             .keys = spans,
                             .head_dim = head_dim});
}

// -cos(k_t, mean of all keys), computed plainly.
std::vector<double> dissimilarity(const std::vector<float>& keys, int32_t head_dim) {
  const size_t n = keys.size() / static_cast<size_t>(head_dim);
  std::vector<double> mean(static_cast<size_t>(head_dim), 0.0);
  for (size_t t = 0; t < n; ++t) {
    for (int32_t c = 0; c < head_dim; ++c) mean[c] += keys[t * head_dim + c] / double(n);
  }
  std::vector<double> out;
  for (size_t t = 0; t < n; ++t) {
    double dot = 0, kk = 0, mm = 0;
    for (int32_t c = 0; c < head_dim; ++c) {
      dot += keys[t * head_dim + c] * mean[c];
      kk += double(keys[t * head_dim + c]) * keys[t * head_dim + c];
      mm += mean[c] * mean[c];
    }
    out.push_back(-dot / std::sqrt(kk * mm));
  }
  return out;
}

TEST(KeyDiff, KeepsTheKeysLeastLikeTheMeanKeyAndTheWindow) {
  // Keys 0..11 point near +x; keys 3 and 8 point elsewhere, and key 5 away: they are kept.
  const int32_t d = 4;
  std::vector<float> keys;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> noise(-0.1f, 0.1f);
  for (int t = 0; t < 12; ++t) {
    float k[d] = {1.0f + noise(rng), noise(rng), noise(rng), noise(rng)};
    if (t == 3) k[1] = 2.0f;
    if (t == 5) k[0] = -1.0f;
    if (t == 8) k[2] = 1.5f;
    keys.insert(keys.end(), k, k + d);
  }
  const SparsityController::Compression out = compress("keydiff:B=3,W=2", 1, {keys}, d);
  ASSERT_TRUE(out.keep[0].has_value());
  EXPECT_EQ(*out.keep[0], (std::vector<int32_t>{3, 5, 8, 10, 11}));
  EXPECT_FALSE(out.attention_recovery.has_value());  // nothing scored attention

  // On random keys: the kept prefix is the top B by the plain formula.
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::mt19937 r(seed);
    std::normal_distribution<float> gauss(0.3f, 1.0f);
    const int32_t head_dim = 8, n = 40, budget = 7, window = 5;
    std::vector<float> random(static_cast<size_t>(n * head_dim));
    for (float& v : random) v = gauss(r);
    const std::vector<double> want_scores = dissimilarity(random, head_dim);
    std::vector<int32_t> order(n - window);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return want_scores[a] > want_scores[b]; });
    std::vector<int32_t> want(order.begin(), order.begin() + budget);
    std::sort(want.begin(), want.end());
    for (int32_t t = n - window; t < n; ++t) want.push_back(t);
    const auto got = compress("keydiff:B=7,W=5", 1, {random}, head_dim);
    EXPECT_EQ(*got.keep[0], want) << seed;
  }
}

TEST(KeyDiff, AdaKvSharesItsBudgetOverKeyDiffScores) {
  // Head 0's keys are all alike except one; head 1's point every way: of a shared budget of
  // 2 * 3, each keeps its floor (floor(0.34 * 3) = 1: head 0 its odd key) and head 1 the rest.
  const int32_t d = 2;
  std::vector<float> alike, spread;
  for (int t = 0; t < 10; ++t) {
    alike.insert(alike.end(), {1.0f, t == 4 ? 1.0f : 0.01f * static_cast<float>(t)});
    const float angle = 0.6f * static_cast<float>(t);
    spread.insert(spread.end(), {std::cos(angle), std::sin(angle)});
  }
  const auto out = compress("adakv:B=3,W=1,alpha=0.34,score=keydiff", 2, {alike, spread}, d);
  ASSERT_TRUE(out.keep[0] && out.keep[1]);
  const size_t kept_outside_window = out.keep[0]->size() + out.keep[1]->size() - 2;
  EXPECT_EQ(kept_outside_window, 6u);
  EXPECT_EQ(*out.keep[0], (std::vector<int32_t>{4, 9}));
  EXPECT_EQ(out.keep[1]->size(), 6u);
}

}  // namespace
}  // namespace sieve::sparsity
