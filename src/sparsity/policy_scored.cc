// What every scored policy has: a budget and a window (policy_scored.h).
#include "sparsity/policy_scored.h"

namespace sieve::sparsity {

int64_t scored_budget(const ScoredSpec& scored) {
  return std::visit([](const auto& s) { return s.budget; }, scored);
}

void set_scored_budget(ScoredSpec& scored, int64_t budget) {
  std::visit([&](auto& s) { s.budget = budget; }, scored);
}

int64_t scored_window(const ScoredSpec& scored) {
  return std::visit([](const auto& s) { return s.window; }, scored);
}

std::string_view scored_name(const ScoredSpec& scored) {
  return std::visit([](const auto& s) { return Scored<std::decay_t<decltype(s)>>::name(); },
                    scored);
}

}  // namespace sieve::sparsity
