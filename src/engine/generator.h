#pragma once
// Single-sequence generation: evaluate the prompt in one batch, then one token per step.
// The foundation that `sieve run` and the golden tests use; the batched engine builds on the
// same Model::forward.
#include <functional>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "kernels/backend.h"
#include "model/model.h"

namespace sieve::engine {

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplingParams sampling;
  // Stop before emitting a token for which this returns true (e.g. end-of-generation ids).
  std::function<bool(TokenId)> is_stop_token;
};

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prompt_seconds = 0.0;    // prompt evaluation up to the first logits
  double generate_seconds = 0.0;  // everything after
  double prompt_tokens_per_second() const {
    return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0;
  }
  double generated_tokens_per_second() const {
    return generate_seconds > 0 ? generated_tokens / generate_seconds : 0;
  }
};

// Called with each generated token and the logits it was sampled from; return false to stop.
using TokenCallback = std::function<bool(TokenId token, std::span<const float> logits)>;

// Throws sieve::Error if the prompt is empty or prompt + max_tokens exceeds the context.
GenerationStats generate(const model::Model& model, std::span<const TokenId> prompt,
                         const GenerateOptions& options, const TokenCallback& on_token);

}  // namespace sieve::engine
