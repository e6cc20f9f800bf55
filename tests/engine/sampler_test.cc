#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace sieve::engine {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.5f, -1.0f, 3.0f, 0.0f};

TEST(Sampler, GreedyTakesTheFirstLargest) {
  Sampler sampler({.temperature = 0.0f});
  EXPECT_EQ(sampler.sample(kLogits), 1);
}

TEST(Sampler, SameSeedSameSequence) {
  Sampler a({.temperature = 1.0f, .seed = 42}), b({.temperature = 1.0f, .seed = 42});
  Sampler c({.temperature = 1.0f, .seed = 43});
  std::vector<TokenId> sa, sb, sc;
  for (int i = 0; i < 200; ++i) {
    sa.push_back(a.sample(kLogits));
    sb.push_back(b.sample(kLogits));
    sc.push_back(c.sample(kLogits));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  Sampler top_k({.temperature = 1.5f, .top_k = 1, .seed = 3});
  Sampler top_p({.temperature = 1.5f, .top_p = 0.01f, .seed = 3});
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(top_k.sample(kLogits), 1);
    EXPECT_EQ(top_p.sample(kLogits), 1);
  }
}

TEST(Sampler, TopKTwoOnlyEverPicksTheTwoBest) {
  Sampler sampler({.temperature = 1.0f, .top_k = 2, .seed = 9});
  std::map<TokenId, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[sampler.sample(kLogits)];
  EXPECT_EQ(counts.size(), 2u);
  EXPECT_GT(counts[1], 800);
  EXPECT_GT(counts[4], 800);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // p relative to the best: token 2 has exp(-0.5) = 0.61, token 0 exp(-2) = 0.14.
  Sampler sampler({.temperature = 1.0f, .min_p = 0.5f, .seed = 5});
  for (int i = 0; i < 500; ++i) {
    TokenId t = sampler.sample(kLogits);
    EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
  }
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  Sampler sampler({.temperature = 1.0f, .seed = 11});
  std::vector<int> counts(kLogits.size());
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[sampler.sample(kLogits)];
  double total = 0;
  for (float l : kLogits) total += std::exp(l);
  for (size_t i = 0; i < kLogits.size(); ++i) {
    const double p = std::exp(kLogits[i]) / total;
    EXPECT_NEAR(counts[i] / double(n), p, 4 * std::sqrt(p * (1 - p) / n) + 1e-3) << i;
  }
}

TEST(Logprobs, TopLogprobsAreSortedLogSoftmax) {
  std::vector<TokenLogprob> top = top_logprobs(kLogits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 4);
  EXPECT_EQ(top[2].id, 2);
  double total = 0;
  for (float l : kLogits) total += std::exp(l);
  EXPECT_NEAR(top[0].logprob, 3.0 - std::log(total), 1e-6);
  EXPECT_NEAR(token_logprob(kLogits, 3), -1.0 - std::log(total), 1e-6);
}

}  // namespace
}  // namespace sieve::engine
