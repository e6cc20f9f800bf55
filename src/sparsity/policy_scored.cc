// What every scored policy has (a budget and a window), and each stream keeping its own best
// (policy_scored.h).
#include "sparsity/policy_scored.h"

#include "sparsity/selection.h"

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

std::shared_ptr<const KeyScorer> make_scorer(const ScoredSpec& scored) {
  return std::visit([](const auto& s) { return Scored<std::decay_t<decltype(s)>>::scorer(s); },
                    scored);
}

ScoredPolicy::ScoredPolicy(const ScoredSpec& head) : head_(head), scorer_(make_scorer(head)) {}

std::optional<int64_t> ScoredPolicy::max_kept_tokens(int64_t, int64_t max_new_tokens) const {
  return scored_budget(head_) + scored_window(head_) + max_new_tokens;
}

CompressResult ScoredPolicy::compress(const CompressInput& in) {
  const ScoredBudget budget{
      .budget = scored_budget(head_),
      .window = scored_window(head_),
      .follow = std::holds_alternative<SnapKvSpec>(head_) ? std::get<SnapKvSpec>(head_).follow : 0};
  std::vector<float> scores;
  if (in.num_keys > budget.budget + budget.window) scores = scorer_->score(in);
  CompressResult result{.keep = select_scored(scores, in.num_keys, budget)};
  if (!in.scores.empty()) result.recovery = kept_mass_ratio(in.scores, *result.keep);
  return result;
}

StreamReport ScoredPolicy::report() const { return {.kind = std::string(scored_name(head_))}; }

}  // namespace sieve::sparsity
