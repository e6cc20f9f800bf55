#include "speculative/step_cost.h"

#include <algorithm>

namespace sieve::speculative {

namespace {

constexpr double kKeep = 1.0 - 1.0 / StepCost::kMemorySteps;  // weight left to an older sample

}  // namespace

void StepCost::record_step(int64_t tokens, int64_t sequences, double seconds) {
  if (tokens <= 0 || sequences <= 0 || !(seconds > 0)) return;
  const auto x = static_cast<double>(tokens);
  fit_ = {.w = kKeep * fit_.w + 1,
          .x = kKeep * fit_.x + x,
          .y = kKeep * fit_.y + seconds,
          .xx = kKeep * fit_.xx + x * x,
          .xy = kKeep * fit_.xy + x * seconds};
}

void StepCost::record_draft_pass(Method method, int64_t rows, double seconds) {
  if (rows <= 0 || !(seconds > 0)) return;
  const double per_row = seconds / static_cast<double>(rows);
  double& mean = draft_row_seconds_[static_cast<size_t>(method)];
  mean = mean == 0 ? per_row : kKeep * mean + (1 - kKeep) * per_row;
}

double StepCost::draft_token_cost(Method method, int64_t sequences) const {
  const double pass = draft_row_seconds_[static_cast<size_t>(method)];
  const bool drafts_free = method == Method::kNgram;
  if ((pass == 0 && !drafts_free) || fit_.w < 1) return kPriorCost;
  const double mean_x = fit_.x / fit_.w, mean_y = fit_.y / fit_.w;
  const double var_x = fit_.xx / fit_.w - mean_x * mean_x;
  const auto n = static_cast<double>(std::max<int64_t>(sequences, 1));
  double a, b;
  if (var_x > 0.25) {  // steps of different sizes seen: fit both
    b = std::max(0.0, (fit_.xy / fit_.w - mean_x * mean_y) / var_x);
    a = std::max(0.0, mean_y - b * mean_x);
  } else {  // one size only: split the mean step by the prior share per token
    b = kPriorTokenShare * mean_y / std::max(mean_x, 1.0);
    a = mean_y - b * mean_x;
  }
  const double plain_token = (a + b * n) / n;
  if (!(plain_token > 0)) return kPriorCost;
  return ((drafts_free ? 0.0 : pass) + b) / plain_token;
}

}  // namespace sieve::speculative
