#pragma once
// What a draft token costs, measured as the engine runs (for adaptive k,
// speculative/draft_length.h).
//
// One drafted token of one sequence costs its row of a draft pass (a self_sparse pass over the
// sparse views, or a draft model's pass, over all the sequences drafting in it; prompt lookup:
// nothing worth measuring) plus its verification: one more row in the target's step. It is
// weighed against what one token costs in a plain step of the same batch, the step's time over
// its n sequences:
//
//   c = (draft pass seconds per row + b) / ((a + b * n) / n)
//
// where a + b * T is the target's forward time for T tokens, fitted by least squares over
// recent decode-only steps (exponential forgetting, ~kMemorySteps steps): a is what a step
// costs whatever its size (the weights' read, once per step while decode is memory-bound), b
// what each more token adds (its compute, and the attention over its keys). One sequence
// decoding at a long context: c is small (a dominates). Sixteen sequences of a small model: a
// plain step's time is mostly b * 16, so a draft token costs a whole token and c >= 1: batched
// decode is compute-bound, and adaptive k stops drafting there by itself. Until the fit has
// seen steps of different sizes, b stays at kPriorTokenShare of a step's time; until a draft
// pass was timed, c is kPriorCost (DraftLength's old constant).
//
// Wall-clock seconds of the engine thread: on a busy machine they move, and c with them; the
// exponential memory lets it follow.
#include <array>
#include <cstdint>

#include "speculative/speculative_config.h"

namespace sieve::speculative {

class StepCost {
 public:
  static constexpr double kPriorCost = 0.2;
  static constexpr double kPriorTokenShare = 0.05;
  static constexpr double kMemorySteps = 32.0;

  // A decode step of the target (no prompt chunk in it): `tokens` rows (decoded and drafted)
  // over `sequences` sequences took `seconds`.
  void record_step(int64_t tokens, int64_t sequences, double seconds);
  // One draft pass of `method` over `rows` drafting sequences took `seconds`.
  void record_draft_pass(Method method, int64_t rows, double seconds);

  // c for one more draft token of `method` in a step of `sequences` decoding sequences.
  double draft_token_cost(Method method, int64_t sequences) const;

 private:
  struct Fit {  // exponentially weighted sums for y = a + b x
    double w = 0, x = 0, y = 0, xx = 0, xy = 0;
  };
  Fit fit_;
  std::array<double, 4> draft_row_seconds_{};  // by Method, EMA of a pass's time per row; 0: never
};

}  // namespace sieve::speculative
