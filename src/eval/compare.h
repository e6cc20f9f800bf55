#pragma once
// How closely one model reproduces another (e.g. a quantized copy against F32): the reference
// generates greedily; the candidate is then run over exactly the same tokens.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace sieve::eval {

struct ModelAgreement {
  int64_t steps = 0;            // predictions compared (over all prompts)
  int64_t top1_matches = 0;     // candidate argmax == reference argmax, same context
  int64_t free_run_tokens = 0;  // tokens the candidate generates identically on its own
  int64_t free_run_total = 0;
  double max_abs_logit_error = 0.0;  // over every compared vocabulary entry
  double top1_agreement() const { return steps ? static_cast<double>(top1_matches) / steps : 0.0; }
  double free_run_agreement() const {
    return free_run_total ? static_cast<double>(free_run_tokens) / free_run_total : 0.0;
  }
};

ModelAgreement compare_models(const model::Model& reference, const model::Model& candidate,
                              const std::vector<std::vector<int32_t>>& prompts, int32_t num_tokens);

// Greedy continuation of `prompt` (num_tokens tokens) with all the logits it saw.
struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [num_tokens][vocab]
};
GreedyRun run_greedy(const model::Model& model, std::span<const int32_t> prompt,
                     int32_t num_tokens);

}  // namespace sieve::eval
