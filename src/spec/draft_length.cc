#include "spec/draft_length.h"

#include <algorithm>

namespace sieve::spec {

DraftLength::DraftLength(int32_t max_tokens)
    : max_tokens_(std::max(max_tokens, 1)),
      k_(best_length(kPriorAcceptance, kDraftTokenCost, max_tokens_)) {}

void DraftLength::record(int32_t num_drafted, int32_t num_accepted) {
  if (num_drafted <= 0) return;
  for (int32_t i = 0; i < num_accepted; ++i) acceptance_ += kStep * (1.0 - acceptance_);
  if (num_accepted < num_drafted) acceptance_ -= kStep * acceptance_;
  k_ = best_length(acceptance(), kDraftTokenCost, max_tokens_);
}

int32_t DraftLength::best_length(double acceptance, double cost, int32_t max_tokens) {
  int32_t best = 1;
  double best_rate = 0.0;
  double expected = 1.0;  // E(k) = sum of a^i, i = 0..k
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

}  // namespace sieve::spec
