#include "speculative/draft_length.h"

#include <algorithm>

namespace sieve::speculative {

DraftLength::DraftLength(int32_t max_tokens) : max_tokens_(std::max(max_tokens, 1)) {}

int32_t DraftLength::next(double cost) {
  const int32_t k = best_length(acceptance_, cost, max_tokens_);
  if (k > 0) {
    steps_off_ = 0;
    return k;
  }
  // At c >= 1 no acceptance pays (E(k) <= k + 1 <= 1 + c k): nothing to probe for.
  if (cost >= 1.0 || ++steps_off_ < kProbeInterval) return 0;
  steps_off_ = 0;
  return 1;
}

void DraftLength::record(int32_t num_drafted, int32_t num_accepted) {
  if (num_drafted <= 0) return;
  for (int32_t i = 0; i < num_accepted; ++i) acceptance_ += kStep * (1.0 - acceptance_);
  if (num_accepted < num_drafted) acceptance_ -= kStep * acceptance_;
}

int32_t DraftLength::best_length(double acceptance, double cost, int32_t max_tokens) {
  int32_t best = 0;
  double best_rate = 1.0;  // k = 0: one token per plain step
  double expected = 1.0;   // E(k) = sum of a^i, i = 0..k
  double power = 1.0;
  for (int32_t k = 1; k <= max_tokens; ++k) {
    power *= acceptance;
    expected += power;
    const double rate = expected / (1.0 + cost * k);
    if (rate > best_rate * (1.0 + 1e-12)) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

}  // namespace sieve::speculative
