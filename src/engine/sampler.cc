#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace sieve::engine {

TokenId argmax(std::span<const float> logits) {
  return static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

double token_logprob(std::span<const float> logits, TokenId token) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  return static_cast<double>(logits[token]) - max_logit - std::log(sum);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count) {
  count = std::min<int>(count, static_cast<int>(logits.size()));
  std::vector<TokenId> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + count, ids.end(), [&](TokenId a, TokenId b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const float max_logit = logits[ids[0]];
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
  const double log_sum = std::log(sum);
  std::vector<TokenLogprob> top(count);
  for (int i = 0; i < count; ++i) {
    top[i] = {ids[i], static_cast<float>(logits[ids[i]] - max_logit - log_sum)};
  }
  return top;
}

TokenId Sampler::sample(std::span<const float> logits) {
  if (params_.temperature <= 0.0f) return argmax(logits);

  // Candidates sorted by logit, then truncated by top-k, min-p and top-p (in that order).
  candidates_.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) candidates_[i] = {logits[i], static_cast<TokenId>(i)};
  size_t keep = candidates_.size();
  if (params_.top_k > 0) keep = std::min<size_t>(keep, params_.top_k);
  auto by_logit = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  candidates_.resize(keep);

  const float max_logit = candidates_[0].first;
  std::vector<double> probs(keep);
  double total = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((static_cast<double>(candidates_[i].first) - max_logit) / params_.temperature);
    total += probs[i];
  }
  if (params_.min_p > 0.0f) {
    const double threshold = params_.min_p * probs[0];  // probs[0] is the largest
    size_t n = 1;
    while (n < keep && probs[n] >= threshold) ++n;
    keep = n;
    total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  if (params_.top_p < 1.0f) {
    double mass = 0.0;
    size_t n = 0;
    while (n < keep) {
      mass += probs[n++] / total;
      if (mass >= params_.top_p) break;
    }
    keep = n;
    total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  std::uniform_real_distribution<double> uniform(0.0, total);
  double r = uniform(rng_);
  for (size_t i = 0; i < keep; ++i) {
    r -= probs[i];
    if (r <= 0.0) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace sieve::engine
