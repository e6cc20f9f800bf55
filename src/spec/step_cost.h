#pragma once
// What a draft token costs, measured as the engine runs (for adaptive k, spec/draft_length.h).
//
// One drafted token costs its share of a draft pass (a self_sparse pass over the sparse view, or
// a draft model's pass; prompt lookup: nothing worth measuring) plus its verification: one more
// row in the target's step. Relative to the plain decode step it replaces:
//
//   c = (draft pass seconds + b) / (a + b * n)
//
// where a + b * T is the target's forward time for T tokens over n sequences, fitted by least
// squares over recent decode-only steps (exponential forgetting, ~kMemorySteps steps): a is what
// a step costs whatever its size (the weights' read, once per step when decode is memory-bound),
// b what each more token adds (its share of compute; the attention over its keys). Until the fit
// has seen steps of different sizes, b stays at kPriorTokenShare of a step, and until a draft
// pass was timed c is kPriorCost (DraftLength's old constant).
//
// Wall-clock seconds of the engine thread: on a busy machine they move, which moves c with
// them; the exponential memory lets it follow.
#include <array>
#include <cstdint>

#include "spec/speculative_config.h"

namespace sieve::spec {

class StepCost {
 public:
  static constexpr double kPriorCost = 0.2;
  static constexpr double kPriorTokenShare = 0.05;
  static constexpr double kMemorySteps = 32.0;

  // A decode step of the target (no prompt chunk in it): `tokens` rows (decoded and drafted)
  // over `sequences` sequences took `seconds`.
  void record_step(int64_t tokens, int64_t sequences, double seconds);
  // One draft pass of `method` (all its drafting sequences at once) took `seconds`.
  void record_draft_pass(Method method, double seconds);

  // c for one more draft token of `method` in a step of `sequences` decoding sequences.
  double draft_token_cost(Method method, int64_t sequences) const;

 private:
  struct Fit {  // exponentially weighted sums for y = a + b x
    double w = 0, x = 0, y = 0, xx = 0, xy = 0;
  };
  Fit fit_;
  std::array<double, 4> draft_pass_seconds_{};  // by Method, EMA; 0: never timed
};

}  // namespace sieve::spec
