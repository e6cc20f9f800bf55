#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

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

// ---------------------------------------------------------------------------------------------
// Plain references, written for clarity rather than speed.

constexpr float kInf = std::numeric_limits<float>::infinity();

size_t count_of(const std::vector<TokenId>& tokens, TokenId id) {
  return static_cast<size_t>(std::count(tokens.begin(), tokens.end(), id));
}

// Steps 1-2 of the documented order, token by token over the whole vocabulary.
std::vector<float> reference_processed(const std::vector<float>& logits,
                                       const std::vector<TokenId>& prompt,
                                       const std::vector<TokenId>& output,
                                       const SamplingParams& params,
                                       const std::vector<TokenId>& eos_ids) {
  std::vector<float> out = logits;
  for (TokenId v = 0; v < static_cast<TokenId>(out.size()); ++v) {
    float l = out[v];
    if (params.logit_bias.count(v)) l += params.logit_bias.at(v);
    const bool is_stop =
        std::count(params.stop_token_ids.begin(), params.stop_token_ids.end(), v) ||
        (!params.ignore_eos && std::count(eos_ids.begin(), eos_ids.end(), v));
    if (static_cast<int32_t>(output.size()) < params.min_tokens && is_stop) l = -kInf;
    const size_t in_prompt = count_of(prompt, v), in_output = count_of(output, v);
    if (in_prompt + in_output > 0) {
      l = l > 0 ? l / params.repetition_penalty : l * params.repetition_penalty;
    }
    l -= params.frequency_penalty * in_output + params.presence_penalty * (in_output > 0 ? 1 : 0);
    out[v] = l;
  }
  return out;
}

// Steps 4-7: the probability of every token after temperature and truncation (full sort).
std::map<TokenId, double> reference_distribution(const std::vector<float>& logits,
                                                 const SamplingParams& params) {
  std::vector<TokenId> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](TokenId a, TokenId b) { return logits[a] > logits[b]; });
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = std::exp((logits[i] - logits[order[0]]) / params.temperature);
    total += p[i];
  }
  for (double& x : p) x /= total;
  size_t keep = order.size();
  if (params.top_k > 0) keep = std::min<size_t>(keep, params.top_k);  // top-k
  double mass_k = 0;
  for (size_t i = 0; i < keep; ++i) mass_k += p[order[i]];
  if (params.top_p < 1.0f) {  // top-p over the renormalised top-k set
    double mass = 0;
    for (size_t i = 0; i < keep; ++i) {
      mass += p[order[i]] / mass_k;
      if (mass >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  const double p_max = p[order[0]];  // min-p
  while (keep > 1 && p[order[keep - 1]] < params.min_p * p_max) --keep;
  std::map<TokenId, double> dist;
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += p[order[i]];
  for (size_t i = 0; i < keep; ++i) dist[order[i]] = p[order[i]] / kept;
  return dist;
}

std::map<TokenId, int> draw(Sampler& sampler, std::span<const float> logits, int n) {
  std::map<TokenId, int> counts;
  for (int i = 0; i < n; ++i) ++counts[sampler.sample(logits)];
  return counts;
}

std::set<TokenId> keys(const auto& map) {
  std::set<TokenId> out;
  for (const auto& [k, v] : map) out.insert(k);
  return out;
}

// Pearson's chi-square statistic of `counts` against `dist`; every drawn token must be in it.
double chi_square(const std::map<TokenId, int>& counts, const std::map<TokenId, double>& dist,
                  int n) {
  double chi2 = 0;
  for (const auto& [id, p] : dist) {
    const double expected = p * n;
    const double got = counts.count(id) ? counts.at(id) : 0;
    chi2 += (got - expected) * (got - expected) / expected;
  }
  return chi2;
}

// ---------------------------------------------------------------------------------------------
// Penalties, bias, min_tokens.

const std::vector<float> kRow = {2.0f, -1.0f, 0.5f, 3.0f, -2.5f, 0.0f, 1.5f, -0.5f};
const std::vector<TokenId> kPrompt = {0, 1, 1, 5};
const std::vector<TokenId> kOutput = {3, 3, 2, 6, 3, 1};
const std::vector<TokenId> kEos = {7};

void expect_processed_matches_reference(const SamplingParams& params) {
  Sampler sampler(params, kEos);
  // Grow the output one token at a time: exercises the incremental counts.
  for (size_t n = 0; n <= kOutput.size(); ++n) {
    const std::vector<TokenId> output(kOutput.begin(), kOutput.begin() + n);
    const std::vector<float> got = sampler.processed_logits(kRow, {kPrompt, output});
    const std::vector<float> want = reference_processed(kRow, kPrompt, output, params, kEos);
    for (size_t v = 0; v < kRow.size(); ++v) {
      if (std::isinf(want[v])) {
        EXPECT_EQ(got[v], want[v]) << "token " << v << " after " << n << " outputs";
      } else {
        EXPECT_NEAR(got[v], want[v], 1e-6) << "token " << v << " after " << n << " outputs";
      }
    }
  }
}

TEST(Penalties, RepetitionCoversPromptAndOutput) {
  expect_processed_matches_reference({.temperature = 1.0f, .repetition_penalty = 1.3f});
  expect_processed_matches_reference({.temperature = 1.0f, .repetition_penalty = 0.7f});
}

TEST(Penalties, PresenceAndFrequencyCoverOutputOnly) {
  expect_processed_matches_reference({.temperature = 1.0f, .presence_penalty = 0.5f});
  expect_processed_matches_reference({.temperature = 1.0f, .frequency_penalty = 0.25f});
  expect_processed_matches_reference(
      {.temperature = 1.0f, .presence_penalty = -1.5f, .frequency_penalty = 1.75f});
}

TEST(Penalties, LogitBiasAndMinTokens) {
  expect_processed_matches_reference(
      {.temperature = 1.0f, .logit_bias = {{4, 2.0f}, {0, -100.0f}}});
  expect_processed_matches_reference({.temperature = 1.0f, .min_tokens = 3, .stop_token_ids = {2}});
  expect_processed_matches_reference(
      {.temperature = 1.0f, .min_tokens = 4, .stop_token_ids = {2}, .ignore_eos = true});
}

TEST(Penalties, AllTogether) {
  expect_processed_matches_reference({.temperature = 0.8f,
                                      .repetition_penalty = 1.2f,
                                      .presence_penalty = 0.4f,
                                      .frequency_penalty = 0.3f,
                                      .logit_bias = {{7, 5.0f}, {4, 1.0f}},
                                      .min_tokens = 2,
                                      .stop_token_ids = {4}});
}

TEST(Penalties, RecountsWhenTheHistoryShrinks) {
  const SamplingParams params{
      .temperature = 1.0f, .repetition_penalty = 1.5f, .frequency_penalty = 0.5f};
  Sampler sampler(params, kEos);
  sampler.processed_logits(kRow, {kPrompt, kOutput});
  const std::vector<TokenId> shorter = {6};
  const std::vector<float> got = sampler.processed_logits(kRow, {kPrompt, shorter});
  const std::vector<float> want = reference_processed(kRow, kPrompt, shorter, params, kEos);
  for (size_t v = 0; v < kRow.size(); ++v) EXPECT_NEAR(got[v], want[v], 1e-6) << v;
}

TEST(Penalties, GreedyIsDecidedAfterPenalties) {
  // Token 3 is the raw argmax; a repetition penalty on it hands the win to token 0.
  Sampler plain({.temperature = 0.0f});
  Sampler penalised({.temperature = 0.0f, .repetition_penalty = 2.0f});
  const std::vector<TokenId> output = {3};
  EXPECT_EQ(plain.sample(kRow, {{}, output}).token, 3);
  EXPECT_EQ(penalised.sample(kRow, {{}, output}).token, 0);
}

TEST(Penalties, LogitBiasSteersAndBans) {
  Sampler steer({.temperature = 0.0f, .logit_bias = {{4, 6.0f}}});
  EXPECT_EQ(steer.sample(kRow, {}).token, 4);  // -2.5 + 6 = 3.5 > 3
  Sampler ban({.temperature = 1.0f, .seed = 1, .logit_bias = {{3, -100.0f}, {0, -100.0f}}});
  const std::map<TokenId, int> counts = draw(ban, kRow, 3000);
  EXPECT_FALSE(counts.count(3));
  EXPECT_FALSE(counts.count(0));
  EXPECT_GT(counts.size(), 3u);
}

TEST(Penalties, MinTokensMasksEosAndStopIdsUntilReached) {
  // EOS (7) and stop id 5 are the two best tokens.
  const std::vector<float> row = {0.0f, 0.1f, 0.2f, 0.3f, 0.4f, 4.0f, 0.5f, 5.0f};
  Sampler sampler({.temperature = 0.0f, .min_tokens = 3, .stop_token_ids = {5}}, kEos);
  std::vector<TokenId> output;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sampler.sample(row, {{}, output}).token, 6) << i;
    output.push_back(6);
  }
  EXPECT_EQ(sampler.sample(row, {{}, output}).token, 7);

  Sampler ignoring(
      {.temperature = 0.0f, .min_tokens = 3, .stop_token_ids = {5}, .ignore_eos = true}, kEos);
  EXPECT_EQ(ignoring.sample(row, {}).token, 7);  // EOS is an ordinary token now

  // A positive bias cannot undo the mask.
  Sampler biased({.temperature = 1.0f, .seed = 4, .logit_bias = {{7, 100.0f}}, .min_tokens = 1},
                 kEos);
  for (int i = 0; i < 200; ++i) EXPECT_NE(biased.sample(row, {}).token, 7);
}

TEST(Penalties, CallerLogitsAreNotModified) {
  const std::vector<float> row = kRow;
  Sampler sampler({.temperature = 0.7f,
                   .seed = 3,
                   .repetition_penalty = 1.4f,
                   .presence_penalty = 1.0f,
                   .logit_bias = {{1, 3.0f}},
                   .min_tokens = 5},
                  kEos);
  for (int i = 0; i < 5; ++i) sampler.sample(row, {kPrompt, kOutput});
  EXPECT_EQ(row, kRow);
}

// ---------------------------------------------------------------------------------------------
// Truncation and the sampled distribution.

// Probabilities at temperature 1, by id: 3 > 0 > 6 > 2 > 5 > 7 > 1 > 4.
const std::vector<double> kProbs = {0.25, 0.02, 0.10, 0.35, 0.01, 0.08, 0.15, 0.04};
std::vector<float> log_probs() {
  std::vector<float> out;
  for (double p : kProbs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

struct TruncationCase {
  SamplingParams params;
  std::set<TokenId> kept;
};

TEST(Truncation, KeptSetsAndFrequencies) {
  const std::vector<float> row = log_probs();
  const std::vector<TruncationCase> cases = {
      {{.temperature = 1.0f}, {0, 1, 2, 3, 4, 5, 6, 7}},
      {{.temperature = 1.0f, .top_k = 3}, {3, 0, 6}},
      {{.temperature = 1.0f, .top_p = 0.5f}, {3, 0}},
      {{.temperature = 1.0f, .top_p = 0.7f}, {3, 0, 6}},
      {{.temperature = 1.0f, .min_p = 0.3f}, {3, 0, 6}},  // 0.10 < 0.3 * 0.35
      {{.temperature = 1.0f, .min_p = 0.25f}, {3, 0, 6, 2}},
      // top-p renormalises over the top-k set: 0.75 / 0.93 >= 0.8 (over all tokens 0.75 < 0.8).
      {{.temperature = 1.0f, .top_k = 5, .top_p = 0.8f}, {3, 0, 6}},
      // min-p after top-p: top-p keeps {3, 0, 6, 2} (0.85 >= 0.8); min-p 0.25 keeps the same.
      // (min-p first and a renormalised top-p would keep only {3, 0, 6}.)
      {{.temperature = 1.0f, .top_p = 0.8f, .min_p = 0.25f}, {3, 0, 6, 2}},
      {{.temperature = 1.0f, .top_k = 6, .top_p = 0.95f, .min_p = 0.2f}, {3, 0, 6, 2, 5}},
      // Temperature comes first: at T = 2, p ∝ sqrt(p1), so min-p 0.45 keeps sqrt(p) >=
      // 0.45 * sqrt(0.35), i.e. p >= 0.0709: {3, 0, 6, 2, 5}.
      {{.temperature = 2.0f, .min_p = 0.45f}, {3, 0, 6, 2, 5}},
      {{.temperature = 0.5f, .top_k = 4}, {3, 0, 6, 2}},
  };
  const int n = 20000;
  for (size_t c = 0; c < cases.size(); ++c) {
    SamplingParams params = cases[c].params;
    params.seed = 1000 + c;
    const std::map<TokenId, double> want = reference_distribution(row, params);
    EXPECT_EQ(keys(want), cases[c].kept) << "reference, case " << c;
    Sampler sampler(params);
    const std::map<TokenId, int> counts = draw(sampler, row, n);
    EXPECT_EQ(keys(counts), cases[c].kept) << "case " << c;
    // df <= 7; P(chi2 > 30) < 1e-4 for df = 7.
    EXPECT_LT(chi_square(counts, want, n), 30.0) << "case " << c;
  }
}

TEST(Truncation, TopPOverALargeVocabularySortsInChunks) {
  // 1000 tokens with slowly rising logits: top-p 0.6 keeps ~366, which takes three rounds of
  // the partial sort (the top 64, then 256 more, then the rest).
  std::vector<float> row(1000);
  for (size_t i = 0; i < row.size(); ++i) row[i] = 0.002f * static_cast<float>(i);
  const SamplingParams params{.temperature = 1.0f, .top_p = 0.6f, .seed = 77};
  const std::map<TokenId, double> want = reference_distribution(row, params);
  ASSERT_GT(want.size(), 64u + 256u);
  Sampler sampler(params);
  const std::map<TokenId, int> counts = draw(sampler, row, 30000);
  EXPECT_EQ(keys(counts), keys(want));
}

TEST(Truncation, MaskedTokensAreNeverDrawn) {
  std::vector<float> row = log_probs();
  row[3] = -kInf;
  Sampler sampler({.temperature = 1.0f, .seed = 8});
  EXPECT_FALSE(draw(sampler, row, 2000).count(3));
}

// ---------------------------------------------------------------------------------------------
// Reproducibility.

TEST(Reproducibility, SameSeedSameTokensWhateverElseRuns) {
  const SamplingParams params{.temperature = 0.9f,
                              .top_k = 6,
                              .top_p = 0.95f,
                              .seed = 1234,
                              .repetition_penalty = 1.1f,
                              .frequency_penalty = 0.2f};
  auto run = [&](bool interleave) {
    Sampler sampler(params, kEos);
    Sampler other({.temperature = 1.0f, .seed = 1234});  // same seed, another "sequence"
    std::vector<TokenId> output;
    for (int i = 0; i < 100; ++i) {
      if (interleave) {
        other.sample(log_probs());
        other.sample(kRow);
      }
      output.push_back(sampler.sample(log_probs(), {kPrompt, output}).token);
    }
    return output;
  };
  EXPECT_EQ(run(false), run(true));
}

TEST(Reproducibility, SamplesOfOneRequestHaveTheirOwnSeeds) {
  const SamplingParams request{.temperature = 1.0f, .seed = 500, .n = 3};
  std::vector<std::vector<TokenId>> runs;
  for (int32_t idx = 0; idx < request.n; ++idx) {
    const SamplingParams params = params_for_sample(request, idx);
    EXPECT_EQ(params.seed, 500u + idx);
    EXPECT_EQ(params.n, 1);
    Sampler a(params), b(params);
    std::vector<TokenId> sa, sb;
    for (int i = 0; i < 50; ++i) {
      sa.push_back(a.sample(log_probs()));
      sb.push_back(b.sample(log_probs()));
    }
    EXPECT_EQ(sa, sb);
    runs.push_back(sa);
  }
  EXPECT_NE(runs[0], runs[1]);
  EXPECT_NE(runs[1], runs[2]);
}

// ---------------------------------------------------------------------------------------------
// Logprobs.

TEST(Logprobs, TopNMatchesAFullSort) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> level(-40, 40);
  std::vector<float> row(5000);
  for (float& l : row) l = 0.25f * level(rng);  // many exact ties
  std::vector<TokenId> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](TokenId a, TokenId b) { return row[a] > row[b]; });
  double total = 0;
  for (float l : row) total += std::exp(static_cast<double>(l));
  for (int n : {1, 5, 20, 5000}) {
    const std::vector<TokenLogprob> top = top_logprobs(row, n);
    ASSERT_EQ(top.size(), static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(top[i].id, order[i]) << "n " << n << " rank " << i;
      EXPECT_NEAR(top[i].logprob, row[order[i]] - std::log(total), 1e-5);
    }
  }
  EXPECT_TRUE(top_logprobs(row, 0).empty());
}

TEST(Logprobs, SampleReturnsRawLogprobsOnRequest) {
  const std::vector<TokenId> output = {3, 3};
  Sampler none({.temperature = 0.0f});
  SampleResult r = none.sample(kRow, {});
  EXPECT_FALSE(r.logprob.has_value());
  EXPECT_TRUE(r.top.empty());

  Sampler only_sampled({.temperature = 0.0f, .logprobs = 0});
  r = only_sampled.sample(kRow, {});
  ASSERT_TRUE(r.logprob.has_value());
  EXPECT_NEAR(*r.logprob, token_logprob(kRow, r.token), 1e-6);
  EXPECT_TRUE(r.top.empty());

  // Penalties and bias change the choice, not the reported (raw) logprobs.
  Sampler top3(
      {.temperature = 0.0f, .repetition_penalty = 3.0f, .logit_bias = {{7, 4.0f}}, .logprobs = 3});
  r = top3.sample(kRow, {{}, output});
  EXPECT_EQ(r.token, 7);  // -0.5 + 4 = 3.5 beats 3 / 3 and 2
  EXPECT_NEAR(*r.logprob, token_logprob(kRow, 7), 1e-6);
  const std::vector<TokenLogprob> want = top_logprobs(kRow, 3);
  ASSERT_EQ(r.top.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r.top[i].id, want[i].id);
    EXPECT_FLOAT_EQ(r.top[i].logprob, want[i].logprob);
  }
  EXPECT_EQ(r.top[0].id, 3);
}

// ---------------------------------------------------------------------------------------------
// Validation.

TEST(SamplingParamsCheck, AcceptsDefaultsAndRejectsNonsense) {
  EXPECT_FALSE(check_sampling_params({}, 100).has_value());
  EXPECT_FALSE(check_sampling_params({.temperature = 0.7f,
                                      .top_k = 40,
                                      .top_p = 0.9f,
                                      .min_p = 0.05f,
                                      .repetition_penalty = 1.1f,
                                      .logit_bias = {{99, -100.0f}},
                                      .min_tokens = 4,
                                      .max_tokens = 4,
                                      .stop_strings = {"\n\n"},
                                      .logprobs = 20,
                                      .n = 2},
                                     100)
                   .has_value());
  const std::vector<std::pair<SamplingParams, std::string>> bad = {
      {{.temperature = -1.0f}, "temperature"},
      {{.temperature = 101.0f}, "temperature"},
      {{.top_k = -1}, "top_k"},
      {{.top_p = 0.0f}, "top_p"},
      {{.top_p = 1.5f}, "top_p"},
      {{.min_p = 2.0f}, "min_p"},
      {{.repetition_penalty = 0.0f}, "repetition_penalty"},
      {{.repetition_penalty = 101.0f}, "repetition_penalty"},
      {{.presence_penalty = 3.0f}, "presence_penalty"},
      {{.frequency_penalty = -2.5f}, "frequency_penalty"},
      {{.logit_bias = {{100, 1.0f}}}, "logit_bias"},
      {{.logit_bias = {{1, 101.0f}}}, "logit_bias"},
      {{.min_tokens = -1}, "min_tokens"},
      {{.max_tokens = -1}, "max_tokens"},
      {{.min_tokens = 5, .max_tokens = 4}, "min_tokens"},
      {{.stop_token_ids = {-1}}, "stop_token_ids"},
      {{.stop_strings = {""}}, "stop"},
      {{.logprobs = 21}, "logprobs"},
      {{.n = 0}, "n"},
  };
  for (size_t i = 0; i < bad.size(); ++i) {
    const std::optional<AdmissionError> problem = check_sampling_params(bad[i].first, 100);
    ASSERT_TRUE(problem.has_value()) << "case " << i;
    EXPECT_EQ(problem->kind, AdmissionError::Kind::kInvalidParams) << "case " << i;
    EXPECT_EQ(problem->param, bad[i].second) << "case " << i;
    EXPECT_FALSE(problem->message.empty()) << "case " << i;
  }
  EXPECT_EQ(all_stop_token_ids({.stop_token_ids = {9, 2, 9}}, std::vector<TokenId>{2, 1}),
            (std::vector<TokenId>{1, 2, 9}));
  EXPECT_EQ(
      all_stop_token_ids({.stop_token_ids = {9}, .ignore_eos = true}, std::vector<TokenId>{1}),
      (std::vector<TokenId>{9}));
}

}  // namespace
}  // namespace sieve::engine
