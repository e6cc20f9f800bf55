#pragma once
// Token sampling from one row of logits. Each sequence owns its Sampler (and so its RNG):
// the same seed gives the same tokens whatever else runs.
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace sieve::engine {

using TokenId = int32_t;

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax; ties go to the lowest id)
  int32_t top_k = 0;         // 0: no limit
  float top_p = 1.0f;        // nucleus mass, (0, 1]
  float min_p = 0.0f;        // drop tokens with p < min_p * p_max
  uint64_t seed = 0;
};

struct TokenLogprob {
  TokenId id = 0;
  float logprob = 0.0f;
};

class Sampler {
 public:
  explicit Sampler(SamplingParams params) : params_(params), rng_(params.seed) {}
  const SamplingParams& params() const { return params_; }

  TokenId sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, TokenId>> candidates_;  // scratch
};

TokenId argmax(std::span<const float> logits);
// The `count` most likely tokens with log-softmax values of the raw logits, largest first.
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count);
// log_softmax(logits)[token], computed in double for accuracy.
double token_logprob(std::span<const float> logits, TokenId token);

}  // namespace sieve::engine
