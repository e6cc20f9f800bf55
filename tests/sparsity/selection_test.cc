// Keep-set selection: SnapKV pooling and top-B, streaming, H2O's decode loop, FastGen's choice,
// Quest page ranking; each against an independent brute-force statement of its rule.
#include "sparsity/selection.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

namespace sieve::sparsity {
namespace {

std::vector<float> random_scores(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<int32_t> range(int32_t begin, int32_t end) {
  std::vector<int32_t> v(static_cast<size_t>(end - begin));
  std::iota(v.begin(), v.end(), begin);
  return v;
}

// Brute force: the k best by (score desc, index asc), via a full sort.
std::vector<int32_t> sorted_top_k(const std::vector<float>& scores, int64_t k) {
  std::vector<int32_t> idx = range(0, static_cast<int32_t>(scores.size()));
  std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a < b;
  });
  idx.resize(static_cast<size_t>(std::min<int64_t>(k, std::ssize(idx))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(TopK, TiesGoToTheLowerIndexAndNaNRanksLast) {
  EXPECT_EQ(top_k_indices(std::vector<float>{1, 3, 3, 2, 3}, 2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(top_k_indices(std::vector<float>{0, 0, 0, 0}, 3), (std::vector<int32_t>{0, 1, 2}));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(top_k_indices(std::vector<float>{nan, -1, nan, -5}, 2), (std::vector<int32_t>{1, 3}));
  EXPECT_EQ(top_k_indices(std::vector<float>{1, 2}, 5), (std::vector<int32_t>{0, 1}));
  for (uint32_t seed = 0; seed < 20; ++seed) {
    std::vector<float> scores = random_scores(100, seed);
    for (float& s : scores) s = std::round(s * 8) / 8;  // many ties
    EXPECT_EQ(top_k_indices(scores, 17), sorted_top_k(scores, 17)) << seed;
  }
}

TEST(Streaming, KeepsSinksAndWindow) {
  EXPECT_EQ(select_sink_window(10, {2, 3}), (std::vector<int32_t>{0, 1, 7, 8, 9}));
  EXPECT_EQ(select_sink_window(5, {2, 3}), range(0, 5));
  EXPECT_EQ(select_sink_window(4, {2, 3}), range(0, 4));
  EXPECT_EQ(select_sink_window(10, {0, 3}), (std::vector<int32_t>{7, 8, 9}));
}

TEST(SnapKv, PoolsThePrefixAndKeepsTopBPlusTheWindow) {
  // n = 10, window 3: prefix 0..6. Max pool, kernel 3.
  const std::vector<float> scores = {0.1f, 0.0f, 0.0f, 0.9f, 0.0f, 0.0f, 0.2f, 5, 5, 5};
  const ObservationTopHead max3{2, 3, 3, Pooling::kMax};
  EXPECT_EQ(pool_scores(scores, max3),
            (std::vector<float>{0.1f, 0.1f, 0.9f, 0.9f, 0.9f, 0.2f, 0.2f}));
  // Pooled ties at 0.9 (2, 3, 4): the lower indices win.
  EXPECT_EQ(select_snapkv(scores, max3), (std::vector<int32_t>{2, 3, 7, 8, 9}));
  const ObservationTopHead avg3{2, 3, 3, Pooling::kAvg};
  const std::vector<float> avg = pool_scores(scores, avg3);
  EXPECT_FLOAT_EQ(avg[0], 0.05f);  // edges average the neighbours present
  EXPECT_FLOAT_EQ(avg[3], 0.3f);
  EXPECT_FLOAT_EQ(avg[6], 0.1f);
  // Without pooling the raw top-2 of the prefix are 3 and 6.
  EXPECT_EQ(select_snapkv(scores, {2, 3, 1, Pooling::kMax}), (std::vector<int32_t>{3, 6, 7, 8, 9}));
  // Short prompts are kept whole.
  EXPECT_EQ(select_snapkv(std::vector<float>(5, 1.0f), max3), range(0, 5));
}

// G spends the budget best first, each chosen key bringing the G tokens after it: a question
// that attends where its answer starts keeps the answer.
TEST(SnapKv, FollowBringsTheTokensAfterEachChosenKey) {
  std::vector<float> scores(22, 0.0f);  // window 2: prefix 0..19
  scores[5] = 1.0f;
  scores[14] = 0.5f;
  scores[15] = 0.4f;
  ObservationTopHead head{6, 2, 1, Pooling::kMax};
  head.follow = 3;
  // 5 brings 6..8; 14 brings 15 before the budget (6) runs out.
  EXPECT_EQ(select_snapkv(scores, head), (std::vector<int32_t>{5, 6, 7, 8, 14, 15, 20, 21}));
  // A chosen key near the prefix's end brings what there is; the budget goes on down the ranking.
  std::vector<float> late(22, 0.0f);
  late[18] = 1.0f;
  late[2] = 0.5f;
  head.budget = 5;
  EXPECT_EQ(select_snapkv(late, head), (std::vector<int32_t>{2, 3, 4, 18, 19, 20, 21}));
  // Tokens already kept are not counted twice: 4 (best) brings 5..7; 6, next best and kept,
  // still brings what follows it (8), which spends the budget before 0.
  std::vector<float> overlap(22, 0.0f);
  overlap[4] = 1.0f;
  overlap[6] = 0.9f;
  overlap[0] = 0.8f;
  EXPECT_EQ(select_snapkv(overlap, head), (std::vector<int32_t>{4, 5, 6, 7, 8, 20, 21}));
  // Budget and window are respected on random scores, and G = 0 is plain SnapKV.
  for (uint32_t seed = 0; seed < 10; ++seed) {
    const std::vector<float> r = random_scores(80, seed);
    ObservationTopHead h{static_cast<int64_t>(seed * 3 + 1), 4, 3, Pooling::kMax};
    const std::vector<int32_t> plain = select_snapkv(r, h);
    h.follow = seed % 5;
    const std::vector<int32_t> got = select_snapkv(r, h);
    EXPECT_EQ(std::ssize(got), h.budget + h.window) << seed;
    EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
    if (h.follow == 0) {
      EXPECT_EQ(got, plain);
    }
  }
}

TEST(SnapKv, MatchesBruteForceOnRandomScores) {
  for (uint32_t seed = 0; seed < 30; ++seed) {
    const int64_t n = 50 + seed * 7;
    const std::vector<float> scores = random_scores(n, seed);
    const ObservationTopHead head{
        static_cast<int64_t>(seed % 20 + 1), static_cast<int64_t>(seed % 8 + 1),
        static_cast<int64_t>(2 * (seed % 4) + 1), seed % 2 ? Pooling::kAvg : Pooling::kMax};
    const int64_t prefix = n - head.window;
    std::vector<float> pooled(static_cast<size_t>(prefix));
    for (int64_t i = 0; i < prefix; ++i) {
      double best = -1, sum = 0;
      int count = 0;
      for (int64_t j = i - head.pool_kernel / 2; j <= i + head.pool_kernel / 2; ++j) {
        if (j < 0 || j >= prefix) continue;
        best = std::max<double>(best, scores[j]);
        sum += scores[j];
        ++count;
      }
      pooled[i] = head.pooling == Pooling::kMax ? static_cast<float>(best)
                                                : static_cast<float>(sum / count);
    }
    std::vector<int32_t> want = sorted_top_k(pooled, head.budget);
    for (int64_t i = prefix; i < n; ++i) want.push_back(static_cast<int32_t>(i));
    const std::vector<int32_t> got = select_snapkv(scores, head);
    EXPECT_EQ(got, want) << seed;
    EXPECT_EQ(std::ssize(got), head.budget + head.window);
  }
}

TEST(HeavyHitter, StartKeepsTopBudgetAndTheRecentWindow) {
  HeavyHitterState state({2, 2});
  const std::vector<int32_t> positions = range(0, 7);
  const std::vector<float> seed = {0.5f, 0.1f, 0.7f, 0.5f, 0.0f, 0.0f, 0.0f};
  EXPECT_EQ(state.start(positions, seed), (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(std::vector<int32_t>(state.kept_positions().begin(), state.kept_positions().end()),
            (std::vector<int32_t>{0, 2, 5, 6}));
  EXPECT_EQ(state.budget(), 4);
}

// The decode loop against a brute-force restatement: accumulate every row; when over budget,
// among all but the `window` most recent kept tokens, evict the smallest total (ties: the
// higher position).
TEST(HeavyHitter, DecodeMatchesBruteForce) {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    const HeavyHitterHead head{static_cast<int64_t>(seed % 5 + 1), static_cast<int64_t>(seed % 3)};
    HeavyHitterState state(head);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> coarse(0, 4);  // coarse scores: many ties
    const int32_t prompt = 6;
    std::vector<float> seed_scores(prompt);
    for (float& s : seed_scores) s = static_cast<float>(coarse(rng));
    state.start(range(0, prompt), seed_scores);

    std::vector<int32_t> kept(state.kept_positions().begin(), state.kept_positions().end());
    std::vector<double> total;
    for (int32_t p : kept) total.push_back(seed_scores[p]);
    for (int32_t pos = prompt; pos < prompt + 40; ++pos) {
      std::vector<float> row(kept.size() + 1);
      for (float& r : row) r = static_cast<float>(coarse(rng)) / 4.0f;
      const std::optional<int32_t> evicted = state.step(pos, row);
      for (size_t i = 0; i < kept.size(); ++i) total[i] += row[i];
      kept.push_back(pos);
      total.push_back(row.back());
      std::optional<int32_t> want;
      if (std::ssize(kept) > head.heavy_budget + head.window) {
        size_t victim = 0;
        for (size_t i = 0; i + head.window < kept.size(); ++i) {
          if (total[i] <= total[victim]) victim = i;  // later (higher) position on ties
        }
        want = kept[victim];
        kept.erase(kept.begin() + static_cast<ptrdiff_t>(victim));
        total.erase(total.begin() + static_cast<ptrdiff_t>(victim));
      }
      ASSERT_EQ(evicted, want) << "seed " << seed << " pos " << pos;
      ASSERT_EQ(std::vector<int32_t>(state.kept_positions().begin(), state.kept_positions().end()),
                kept);
      ASSERT_LE(std::ssize(state.kept_positions()), state.budget());
      // The recent window always survives.
      for (int32_t r = std::max(0, pos - static_cast<int32_t>(head.window) + 1); r <= pos; ++r) {
        ASSERT_TRUE(std::count(kept.begin(), kept.end(), r)) << r;
      }
    }
  }
}

TEST(FastGen, PicksTheCheapestPolicyThatRecoversEnough) {
  // 10 tokens: 0 special, 4 and 7 punctuation; local window 2 = {8, 9}.
  std::vector<TokenClass> classes(10, TokenClass::kOther);
  classes[0] = TokenClass::kSpecial;
  classes[4] = classes[7] = TokenClass::kPunctuation;
  const FastGenPendingHead head{0.1, 2, 0.1};  // frequent: ceil(1.0) = 1 token
  // Mass on the special token only: special suffices.
  {
    std::vector<float> s(10, 0.0f);
    s[0] = 0.95f;
    s[5] = 0.05f;
    const FastGenDecision d = select_fastgen(s, classes, head);
    EXPECT_EQ(d.choice, FastGenChoice::kSpecial);
    EXPECT_EQ(d.keep, (std::vector<int32_t>{0}));
    EXPECT_NEAR(d.recovery, 0.95, 1e-6);
  }
  // Special + punctuation hold 0.9 / 0.99 >= 1 - T.
  {
    std::vector<float> s = {0.5f, 0, 0, 0, 0.2f, 0.04f, 0, 0.2f, 0.05f, 0};
    const FastGenDecision d = select_fastgen(s, classes, head);
    EXPECT_EQ(d.choice, FastGenChoice::kSpecialPunct);
    EXPECT_EQ(d.keep, (std::vector<int32_t>{0, 4, 7}));
  }
  // Needs the local window.
  {
    std::vector<float> s = {0.3f, 0, 0, 0, 0.1f, 0.05f, 0, 0.1f, 0.25f, 0.2f};
    const FastGenDecision d = select_fastgen(s, classes, head);
    EXPECT_EQ(d.choice, FastGenChoice::kSpecialPunctLocal);
    EXPECT_EQ(d.keep, (std::vector<int32_t>{0, 4, 7, 8, 9}));
    EXPECT_NEAR(d.recovery, 0.95, 1e-6);
  }
  // Needs one frequent token (the highest outside the others: 2).
  {
    std::vector<float> s = {0.3f, 0.01f, 0.2f, 0.04f, 0.1f, 0.05f, 0, 0.1f, 0.1f, 0.1f};
    const FastGenDecision d = select_fastgen(s, classes, head);
    EXPECT_EQ(d.choice, FastGenChoice::kSpecialPunctLocalFrequent);
    EXPECT_EQ(d.keep, (std::vector<int32_t>{0, 2, 4, 7, 8, 9}));
    EXPECT_NEAR(d.recovery, 0.9, 1e-6);
  }
  // Spread out: only full recovers.
  {
    const std::vector<float> s(10, 0.1f);
    const FastGenDecision d = select_fastgen(s, classes, head);
    EXPECT_EQ(d.choice, FastGenChoice::kFull);
    EXPECT_EQ(d.keep, range(0, 10));
    EXPECT_DOUBLE_EQ(d.recovery, 1.0);
  }
  // No attention mass at all: nothing to recover, the cheapest wins.
  EXPECT_EQ(select_fastgen(std::vector<float>(10, 0.0f), classes, head).choice,
            FastGenChoice::kSpecial);
  EXPECT_EQ(to_string(FastGenChoice::kSpecialPunctLocalFrequent), "special+punct+local+frequent");
}

// Random heads: the choice is the first candidate (in cost order) whose recovery, computed
// here by brute force, reaches 1 - T; the keep sets are nested.
TEST(FastGen, MatchesBruteForceOnRandomHeads) {
  for (uint32_t seed = 0; seed < 40; ++seed) {
    const int64_t n = 30 + seed;
    std::mt19937 rng(seed);
    std::vector<float> s = random_scores(n, seed + 100);
    for (float& x : s) x = x * x * x * x;  // skewed, like attention
    std::vector<TokenClass> classes(static_cast<size_t>(n), TokenClass::kOther);
    for (auto& c : classes) {
      const int r = static_cast<int>(rng() % 10);
      c = r == 0 ? TokenClass::kSpecial : r < 3 ? TokenClass::kPunctuation : TokenClass::kOther;
    }
    const FastGenPendingHead head{0.05 * (seed % 5), static_cast<int64_t>(seed % 7 + 1), 0.15};
    const double total = std::accumulate(s.begin(), s.end(), 0.0);
    std::set<int32_t> set;
    std::vector<std::set<int32_t>> sets;
    for (int32_t i = 0; i < n; ++i) {
      if (classes[i] == TokenClass::kSpecial) set.insert(i);
    }
    sets.push_back(set);
    for (int32_t i = 0; i < n; ++i) {
      if (classes[i] == TokenClass::kPunctuation) set.insert(i);
    }
    sets.push_back(set);
    for (int32_t i = std::max<int32_t>(0, n - head.local_window); i < n; ++i) set.insert(i);
    sets.push_back(set);
    std::vector<float> rest = s;
    for (int32_t i : set) rest[i] = -1.0f;  // already kept: never chosen as frequent
    for (int32_t i : sorted_top_k(rest, static_cast<int64_t>(std::ceil(0.15 * n)))) set.insert(i);
    sets.push_back(set);
    for (int32_t i = 0; i < n; ++i) set.insert(i);
    sets.push_back(set);
    size_t want = 0;
    for (; want < sets.size(); ++want) {
      double mass = 0;
      for (int32_t i : sets[want]) mass += s[i];
      if (mass / total >= 1.0 - head.threshold) break;
    }
    const FastGenDecision d = select_fastgen(s, classes, head);
    EXPECT_EQ(static_cast<size_t>(d.choice), want) << seed;
    EXPECT_EQ(d.keep, std::vector<int32_t>(sets[want].begin(), sets[want].end())) << seed;
    EXPECT_GE(d.recovery, 1.0 - head.threshold - 1e-12);
  }
}

std::vector<int32_t> kept_of(const FastGenState& state) {
  return {state.kept_positions().begin(), state.kept_positions().end()};
}

TEST(FastGenState, LocalWindowSlidesAndKeptClassesStay) {
  // Prompt 0..9: 0 special, 4 punctuation; choice special+punct+local with W = 3.
  std::vector<TokenClass> classes(10, TokenClass::kOther);
  classes[0] = TokenClass::kSpecial;
  classes[4] = TokenClass::kPunctuation;
  const std::vector<int32_t> positions = range(0, 10);
  const std::vector<float> scores(10, 0.1f);
  const FastGenPendingHead head{0.05, 3, 0.2};
  const FastGenDecision decision{FastGenChoice::kSpecialPunctLocal, {0, 4, 7, 8, 9}, 0.97};
  FastGenState state(head, decision, positions, classes, scores);
  EXPECT_EQ(state.frequent_budget(), 0);
  EXPECT_EQ(kept_of(state), (std::vector<int32_t>{0, 4, 7, 8, 9}));
  EXPECT_EQ(state.step(10, TokenClass::kOther, std::vector<float>(6, 0.1f)),
            (std::vector<int32_t>{7}));
  EXPECT_EQ(state.step(11, TokenClass::kPunctuation, std::vector<float>(6, 0.1f)),
            (std::vector<int32_t>{8}));
  EXPECT_EQ(state.step(12, TokenClass::kOther, std::vector<float>(6, 0.1f)),
            (std::vector<int32_t>{9}));
  EXPECT_EQ(state.step(13, TokenClass::kOther, std::vector<float>(6, 0.1f)),
            (std::vector<int32_t>{10}));
  EXPECT_EQ(state.step(14, TokenClass::kSpecial, std::vector<float>(6, 0.1f)),
            (std::vector<int32_t>{}));  // 11 (punctuation) stays after leaving the window
  EXPECT_EQ(state.step(15, TokenClass::kOther, std::vector<float>(6, 0.1f)),
            (std::vector<int32_t>{12}));
  EXPECT_EQ(kept_of(state), (std::vector<int32_t>{0, 4, 11, 13, 14, 15}));
}

TEST(FastGenState, SpecialOnlyDropsEachNewTokenAfterItsStepAndFullKeepsAll) {
  const std::vector<TokenClass> classes = {TokenClass::kSpecial, TokenClass::kOther,
                                           TokenClass::kPunctuation};
  const std::vector<float> scores = {0.9f, 0.05f, 0.05f};
  const FastGenPendingHead head{0.2, 1, 0.0};
  FastGenState special(head, {FastGenChoice::kSpecial, {0}, 0.9}, range(0, 3), classes, scores);
  EXPECT_EQ(special.step(3, TokenClass::kOther, std::vector<float>{0.5f, 0.5f}),
            (std::vector<int32_t>{3}));
  EXPECT_EQ(special.step(4, TokenClass::kPunctuation, std::vector<float>{0.5f, 0.5f}),
            (std::vector<int32_t>{4}));  // punctuation is not kept by this choice
  EXPECT_EQ(special.step(5, TokenClass::kSpecial, std::vector<float>{0.5f, 0.5f}),
            (std::vector<int32_t>{}));
  EXPECT_EQ(kept_of(special), (std::vector<int32_t>{0, 5}));
  FastGenState full(head, {FastGenChoice::kFull, {0, 1, 2}, 1.0}, range(0, 3), classes, scores);
  for (int32_t p = 3; p < 10; ++p) {
    EXPECT_TRUE(full.step(p, TokenClass::kOther, std::vector<float>(p + 1, 0.1f)).empty());
  }
  EXPECT_EQ(kept_of(full), range(0, 10));
}

// The frequent choice against a brute-force restatement: after every step the kept set is the
// class-kept tokens, the local window, and the ceil(F * n) best others by accumulated attention.
TEST(FastGenState, FrequentSetMatchesBruteForce) {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    const int32_t n = 40;
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> coarse(0, 3);
    std::vector<TokenClass> classes(n);
    for (auto& c : classes) {
      const int r = static_cast<int>(rng() % 8);
      c = r == 0 ? TokenClass::kSpecial : r == 1 ? TokenClass::kPunctuation : TokenClass::kOther;
    }
    std::vector<float> scores(n);
    for (float& x : scores) x = static_cast<float>(coarse(rng));
    const FastGenPendingHead head{0.0, static_cast<int64_t>(seed % 4 + 1), 0.1};  // 4 frequent
    // Force the frequent choice: the decision's keep set from select_fastgen's own rule.
    FastGenDecision decision =
        select_fastgen(scores, classes, {1.0 - 1e-9, head.local_window, head.frequent_fraction});
    ASSERT_EQ(decision.choice, FastGenChoice::kSpecial);  // T ~ 1: the cheapest
    // Rebuild the frequent-choice keep set by hand.
    std::vector<int32_t> keep;
    std::vector<float> rest = scores;
    for (int32_t i = 0; i < n; ++i) {
      if (classes[i] != TokenClass::kOther || i >= n - head.local_window) {
        keep.push_back(i);
        rest[i] = -1.0f;
      }
    }
    for (int32_t i : sorted_top_k(rest, 4)) keep.push_back(i);
    std::sort(keep.begin(), keep.end());
    decision = {FastGenChoice::kSpecialPunctLocalFrequent, keep, 0.0};
    FastGenState state(head, decision, range(0, n), classes, scores);
    ASSERT_EQ(state.frequent_budget(), 4);

    std::map<int32_t, std::pair<TokenClass, double>> model;  // kept position -> (class, total)
    for (int32_t i : keep) model[i] = {classes[i], scores[i]};
    for (int32_t pos = n; pos < n + 60; ++pos) {
      const auto cls = static_cast<TokenClass>(rng() % 3);
      std::vector<float> row(model.size() + 1);
      for (float& r : row) r = static_cast<float>(coarse(rng)) / 2.0f;
      const std::vector<int32_t> dropped = state.step(pos, cls, row);
      size_t j = 0;
      for (auto& [p, entry] : model) entry.second += row[j++];
      model[pos] = {cls, row.back()};
      std::vector<std::pair<double, int32_t>> others;  // (-total, position): best first
      for (const auto& [p, entry] : model) {
        if (entry.first == TokenClass::kOther && p <= pos - head.local_window) {
          others.emplace_back(-entry.second, p);
        }
      }
      std::sort(others.begin(), others.end());
      std::vector<int32_t> want_dropped;
      for (size_t k = 4; k < others.size(); ++k) want_dropped.push_back(others[k].second);
      std::sort(want_dropped.begin(), want_dropped.end());
      for (int32_t p : want_dropped) model.erase(p);
      ASSERT_EQ(dropped, want_dropped) << "seed " << seed << " pos " << pos;
      std::vector<int32_t> want_kept;
      for (const auto& [p, entry] : model) want_kept.push_back(p);
      ASSERT_EQ(kept_of(state), want_kept);
    }
  }
}

TEST(Pages, ForcedSinkAndLastPagesThenTheBestBounds) {
  // 100 tokens in pages of 16: 7 pages, the last holding 4 tokens.
  const std::vector<float> bounds = {0.0f, 5.0f, 1.0f, 5.0f, 3.0f, 2.0f, -9.0f};
  // K = 4: pages 0 and 6 forced, then 1 and 3 (5.0 tie: both), not 4.
  EXPECT_EQ(select_pages(bounds, 100, 16, {4, 1, 4, 4}), (std::vector<int32_t>{0, 1, 3, 6}));
  // A window reaching back over a page boundary forces page 5 too.
  EXPECT_EQ(select_pages(bounds, 100, 16, {4, 1, 4, 8}), (std::vector<int32_t>{0, 1, 5, 6}));
  // Sinks covering two pages.
  EXPECT_EQ(select_pages(bounds, 100, 16, {4, 1, 20, 1}), (std::vector<int32_t>{0, 1, 3, 6}));
  EXPECT_EQ(select_pages(bounds, 100, 16, {3, 1, 20, 1}), (std::vector<int32_t>{0, 1, 6}));
  // Forced pages beyond K are all returned.
  // (the last 40 tokens are 60..99: pages 3..6)
  EXPECT_EQ(select_pages(bounds, 100, 16, {2, 1, 20, 40}),
            (std::vector<int32_t>{0, 1, 3, 4, 5, 6}));
  // K >= pages: all.
  EXPECT_EQ(select_pages(bounds, 100, 16, {7, 1, 4, 4}), range(0, 7));
  // S = 0 and W = 0 still keep the first and last page.
  EXPECT_EQ(select_pages(bounds, 100, 16, {3, 1, 0, 0}), (std::vector<int32_t>{0, 1, 6}));
}

TEST(StreamingScore, IsTheMassOnSinksAndWindow) {
  const std::vector<float> s = {0.4f, 0.1f, 0.1f, 0.1f, 0.3f};
  EXPECT_NEAR(streaming_score(s, 1, 1), 0.7, 1e-6);
  EXPECT_NEAR(streaming_score(s, 0, 5), 1.0, 1e-6);
  EXPECT_NEAR(streaming_score(s, 0, 0), 0.0, 1e-6);
  EXPECT_DOUBLE_EQ(streaming_score(std::vector<float>(3, 0.0f), 1, 1), 1.0);
}

}  // namespace
}  // namespace sieve::sparsity
