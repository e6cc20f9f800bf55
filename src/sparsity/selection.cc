// Keep-set selection: SnapKV, streaming, H2O, FastGen, Quest pages. See selection.h.
#include "sparsity/selection.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>

namespace sieve::sparsity {

namespace {

// Ranking key: NaN ranks below everything.
double rank_value(float score) {
  return std::isnan(score) ? -std::numeric_limits<double>::infinity() : static_cast<double>(score);
}

// Whether index a ranks before index b (score descending, then index ascending).
template <typename Score>
bool ranks_before(Score score_a, int64_t a, Score score_b, int64_t b) {
  if (score_a != score_b) return score_a > score_b;
  return a < b;
}

std::vector<int32_t> iota_indices(int64_t begin, int64_t end) {
  std::vector<int32_t> out(static_cast<size_t>(std::max<int64_t>(end - begin, 0)));
  std::iota(out.begin(), out.end(), static_cast<int32_t>(begin));
  return out;
}

// The k best of `candidates` (indices into scores) by the ranking rule, unsorted.
std::vector<int32_t> best_of(std::vector<int32_t> candidates, std::span<const float> scores,
                             int64_t k) {
  const auto count = static_cast<size_t>(std::clamp<int64_t>(k, 0, std::ssize(candidates)));
  const auto before = [&](int32_t a, int32_t b) {
    return ranks_before(rank_value(scores[a]), a, rank_value(scores[b]), b);
  };
  std::nth_element(candidates.begin(), candidates.begin() + static_cast<ptrdiff_t>(count),
                   candidates.end(), before);
  candidates.resize(count);
  return candidates;
}

}  // namespace

std::vector<int32_t> top_k_indices(std::span<const float> scores, int64_t k) {
  std::vector<int32_t> out = best_of(iota_indices(0, std::ssize(scores)), scores, k);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> select_sink_window(int64_t num_tokens, const SinkWindowHead& head) {
  if (num_tokens <= head.num_sinks + head.window) return iota_indices(0, num_tokens);
  std::vector<int32_t> out = iota_indices(0, head.num_sinks);
  const std::vector<int32_t> recent = iota_indices(num_tokens - head.window, num_tokens);
  out.insert(out.end(), recent.begin(), recent.end());
  return out;
}

std::vector<float> pool_scores(std::span<const float> scores, const ObservationTopHead& head) {
  const int64_t prefix = std::ssize(scores) - head.window;
  if (prefix <= 0) return {};
  const int64_t radius = head.pool_kernel / 2;
  std::vector<float> pooled(static_cast<size_t>(prefix));
  for (int64_t i = 0; i < prefix; ++i) {
    const int64_t lo = std::max<int64_t>(0, i - radius);
    const int64_t hi = std::min(prefix - 1, i + radius);
    if (head.pooling == Pooling::kMax) {
      float best = scores[static_cast<size_t>(lo)];
      for (int64_t j = lo + 1; j <= hi; ++j) best = std::max(best, scores[static_cast<size_t>(j)]);
      pooled[static_cast<size_t>(i)] = best;
    } else {
      double sum = 0.0;
      for (int64_t j = lo; j <= hi; ++j) sum += scores[static_cast<size_t>(j)];
      pooled[static_cast<size_t>(i)] = static_cast<float>(sum / static_cast<double>(hi - lo + 1));
    }
  }
  return pooled;
}

std::vector<int32_t> select_snapkv(std::span<const float> scores, const ObservationTopHead& head) {
  const int64_t n = std::ssize(scores);
  if (n <= head.budget + head.window) return iota_indices(0, n);
  return select_scored(pool_scores(scores, head), n,
                       {.budget = head.budget, .window = head.window, .follow = head.follow});
}

std::vector<int32_t> select_scored(std::span<const float> pooled, int64_t n,
                                   const ScoredBudget& head) {
  if (n <= head.budget + head.window) return iota_indices(0, n);
  std::vector<int32_t> keep;
  if (head.follow <= 0) {
    keep = top_k_indices(pooled, head.budget);
  } else {
    // Best first; each brings the `follow` tokens after it until the budget is spent.
    const auto prefix = static_cast<int32_t>(pooled.size());
    std::vector<int32_t> order = iota_indices(0, prefix);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return ranks_before(rank_value(pooled[a]), a, rank_value(pooled[b]), b);
    });
    std::vector<uint8_t> kept(static_cast<size_t>(prefix), 0);
    int64_t left = head.budget;
    for (size_t r = 0; r < order.size() && left > 0; ++r) {
      const int64_t end = std::min<int64_t>(prefix, int64_t{order[r]} + head.follow + 1);
      for (int64_t i = order[r]; i < end && left > 0; ++i) {
        if (kept[static_cast<size_t>(i)]) continue;
        kept[static_cast<size_t>(i)] = 1;
        --left;
      }
    }
    for (int32_t i = 0; i < prefix; ++i) {
      if (kept[static_cast<size_t>(i)]) keep.push_back(i);
    }
  }
  const std::vector<int32_t> window = iota_indices(n - head.window, n);
  keep.insert(keep.end(), window.begin(), window.end());
  return keep;
}

// ------------------------------------------------------------------------------ H2O

std::vector<int32_t> HeavyHitterState::start(std::span<const int32_t> positions,
                                             std::span<const float> scores) {
  assert(positions.size() == scores.size());
  assert(std::is_sorted(positions.begin(), positions.end()));
  const int64_t n = std::ssize(positions);
  std::vector<int32_t> keep;
  if (n <= budget()) {
    keep = iota_indices(0, n);
  } else {
    keep = top_k_indices(scores.first(static_cast<size_t>(n - head_.window)), head_.heavy_budget);
    const std::vector<int32_t> recent = iota_indices(n - head_.window, n);
    keep.insert(keep.end(), recent.begin(), recent.end());
  }
  positions_.clear();
  scores_.clear();
  std::vector<int32_t> evicted;
  size_t next = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (next < keep.size() && keep[next] == i) {
      positions_.push_back(positions[static_cast<size_t>(i)]);
      scores_.push_back(rank_value(scores[static_cast<size_t>(i)]));
      ++next;
    } else {
      evicted.push_back(positions[static_cast<size_t>(i)]);
    }
  }
  return evicted;
}

std::optional<int32_t> HeavyHitterState::step(int32_t new_position,
                                              std::span<const float> attention) {
  assert(attention.size() == positions_.size() + 1);
  assert(positions_.empty() || new_position > positions_.back());
  for (size_t i = 0; i < positions_.size(); ++i) scores_[i] += rank_value(attention[i]);
  positions_.push_back(new_position);
  scores_.push_back(rank_value(attention.back()));
  if (std::ssize(positions_) <= budget()) return std::nullopt;
  // Evict the last in ranking order among all but the most recent `window`.
  const int64_t num_candidates = std::ssize(positions_) - head_.window;
  int64_t victim = 0;
  for (int64_t i = 1; i < num_candidates; ++i) {
    if (ranks_before(scores_[static_cast<size_t>(victim)], victim, scores_[static_cast<size_t>(i)],
                     i)) {
      victim = i;
    }
  }
  const int32_t evicted = positions_[static_cast<size_t>(victim)];
  positions_.erase(positions_.begin() + victim);
  scores_.erase(scores_.begin() + victim);
  return evicted;
}

// ------------------------------------------------------------------------------ FastGen

std::string_view to_string(FastGenChoice choice) {
  switch (choice) {
    case FastGenChoice::kSpecial:
      return "special";
    case FastGenChoice::kSpecialPunct:
      return "special+punct";
    case FastGenChoice::kSpecialPunctLocal:
      return "special+punct+local";
    case FastGenChoice::kSpecialPunctLocalFrequent:
      return "special+punct+local+frequent";
    case FastGenChoice::kFull:
      return "full";
  }
  return "?";
}

FastGenDecision select_fastgen(std::span<const float> scores, std::span<const TokenClass> classes,
                               const FastGenPendingHead& head) {
  assert(scores.size() == classes.size());
  const int64_t n = std::ssize(scores);
  double total = 0.0;
  for (float s : scores) total += std::max(rank_value(s), 0.0);
  std::vector<bool> kept(static_cast<size_t>(n), false);
  double kept_mass = 0.0;
  const auto keep = [&](int64_t i) {
    if (!kept[static_cast<size_t>(i)]) {
      kept[static_cast<size_t>(i)] = true;
      kept_mass += std::max(rank_value(scores[static_cast<size_t>(i)]), 0.0);
    }
  };
  const auto decision = [&](FastGenChoice choice) -> std::optional<FastGenDecision> {
    const double recovery = total > 0.0 ? std::min(kept_mass / total, 1.0) : 1.0;
    if (recovery < 1.0 - head.threshold && choice != FastGenChoice::kFull) return std::nullopt;
    FastGenDecision d{choice, {}, recovery};
    for (int64_t i = 0; i < n; ++i) {
      if (kept[static_cast<size_t>(i)]) d.keep.push_back(static_cast<int32_t>(i));
    }
    return d;
  };

  for (int64_t i = 0; i < n; ++i) {
    if (classes[static_cast<size_t>(i)] == TokenClass::kSpecial) keep(i);
  }
  if (auto d = decision(FastGenChoice::kSpecial)) return *d;
  for (int64_t i = 0; i < n; ++i) {
    if (classes[static_cast<size_t>(i)] == TokenClass::kPunctuation) keep(i);
  }
  if (auto d = decision(FastGenChoice::kSpecialPunct)) return *d;
  for (int64_t i = std::max<int64_t>(0, n - head.local_window); i < n; ++i) keep(i);
  if (auto d = decision(FastGenChoice::kSpecialPunctLocal)) return *d;
  const auto num_frequent =
      static_cast<int64_t>(std::ceil(head.frequent_fraction * static_cast<double>(n)));
  std::vector<int32_t> others;
  for (int64_t i = 0; i < n; ++i) {
    if (!kept[static_cast<size_t>(i)]) others.push_back(static_cast<int32_t>(i));
  }
  for (int32_t i : best_of(std::move(others), scores, num_frequent)) keep(i);
  if (auto d = decision(FastGenChoice::kSpecialPunctLocalFrequent)) return *d;
  for (int64_t i = 0; i < n; ++i) keep(i);
  return *decision(FastGenChoice::kFull);
}

FastGenState::FastGenState(const FastGenPendingHead& head, const FastGenDecision& decision,
                           std::span<const int32_t> positions, std::span<const TokenClass> classes,
                           std::span<const float> scores)
    : choice_(decision.choice),
      local_window_(decision.choice >= FastGenChoice::kSpecialPunctLocal ? head.local_window : 0),
      frequent_budget_(decision.choice >= FastGenChoice::kSpecialPunctLocalFrequent
                           ? static_cast<int64_t>(std::ceil(head.frequent_fraction *
                                                            static_cast<double>(positions.size())))
                           : 0) {
  assert(positions.size() == classes.size() && positions.size() == scores.size());
  for (int32_t i : decision.keep) {
    positions_.push_back(positions[static_cast<size_t>(i)]);
    classes_.push_back(classes[static_cast<size_t>(i)]);
    scores_.push_back(rank_value(scores[static_cast<size_t>(i)]));
  }
}

bool FastGenState::kept_for_class(TokenClass token_class) const {
  if (token_class == TokenClass::kSpecial) return true;
  return token_class == TokenClass::kPunctuation && choice_ >= FastGenChoice::kSpecialPunct;
}

std::vector<int32_t> FastGenState::step(int32_t new_position, TokenClass token_class,
                                        std::span<const float> attention) {
  assert(attention.size() == positions_.size() + 1);
  assert(positions_.empty() || new_position > positions_.back());
  for (size_t i = 0; i < positions_.size(); ++i) scores_[i] += rank_value(attention[i]);
  positions_.push_back(new_position);
  classes_.push_back(token_class);
  scores_.push_back(rank_value(attention.back()));
  if (choice_ == FastGenChoice::kFull) return {};

  // Tokens kept neither by class nor by the local window: frequent candidates, or dropped.
  std::vector<size_t> others;
  for (size_t i = 0; i < positions_.size(); ++i) {
    const bool local = int64_t{positions_[i]} > int64_t{new_position} - local_window_;
    if (!local && !kept_for_class(classes_[i])) others.push_back(i);
  }
  std::vector<bool> drop(positions_.size(), false);
  if (std::ssize(others) > frequent_budget_) {
    // Keep the best frequent_budget_ of them (ranking rule), drop the rest.
    std::stable_sort(others.begin(), others.end(), [&](size_t a, size_t b) {
      return ranks_before(scores_[a], static_cast<int64_t>(a), scores_[b], static_cast<int64_t>(b));
    });
    for (size_t j = static_cast<size_t>(frequent_budget_); j < others.size(); ++j) {
      drop[others[j]] = true;
    }
  }
  std::vector<int32_t> dropped;
  size_t out = 0;
  for (size_t i = 0; i < positions_.size(); ++i) {
    if (drop[i]) {
      dropped.push_back(positions_[i]);
      continue;
    }
    positions_[out] = positions_[i];
    classes_[out] = classes_[i];
    scores_[out] = scores_[i];
    ++out;
  }
  positions_.resize(out);
  classes_.resize(out);
  scores_.resize(out);
  return dropped;
}

// ------------------------------------------------------------------------------ pages

std::vector<int32_t> select_pages(std::span<const float> page_bounds, int64_t num_tokens,
                                  int32_t page_size, const PageSelectHead& head) {
  assert(page_size > 0);
  const int64_t num_pages = (num_tokens + page_size - 1) / page_size;
  assert(std::ssize(page_bounds) == num_pages);
  if (num_pages <= head.top_k_pages) return iota_indices(0, num_pages);
  std::vector<bool> forced(static_cast<size_t>(num_pages), false);
  for (int32_t p : forced_pages(num_tokens, page_size, head)) forced[static_cast<size_t>(p)] = true;
  std::vector<int32_t> selected, others;
  for (int64_t p = 0; p < num_pages; ++p) {
    (forced[static_cast<size_t>(p)] ? selected : others).push_back(static_cast<int32_t>(p));
  }
  const int64_t room = head.top_k_pages - std::ssize(selected);
  if (room > 0) {
    const std::vector<int32_t> best = best_of(std::move(others), page_bounds, room);
    selected.insert(selected.end(), best.begin(), best.end());
  }
  std::sort(selected.begin(), selected.end());
  return selected;
}

std::vector<int32_t> forced_pages(int64_t num_tokens, int32_t page_size,
                                  const PageSelectHead& head) {
  const int64_t num_pages = (num_tokens + page_size - 1) / page_size;
  const int64_t sink_end = std::min(num_tokens, std::max<int64_t>(head.num_sinks, 1));
  const int64_t window_begin = std::max<int64_t>(0, num_tokens - std::max<int64_t>(head.window, 1));
  std::vector<int32_t> pages;
  for (int64_t p = 0; p < num_pages; ++p) {
    if (p * page_size < sink_end || p >= window_begin / page_size)
      pages.push_back(static_cast<int32_t>(p));
  }
  return pages;
}

double streaming_score(std::span<const float> scores, int64_t num_sinks, int64_t window) {
  const int64_t n = std::ssize(scores);
  double total = 0.0, local = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double s = std::max(rank_value(scores[static_cast<size_t>(i)]), 0.0);
    total += s;
    if (i < num_sinks || i >= n - window) local += s;
  }
  return total > 0.0 ? local / total : 1.0;
}

}  // namespace sieve::sparsity
