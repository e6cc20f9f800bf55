#pragma once
// Keep-set selection for one KV head from scores it is given. Pure functions of numbers: which
// tokens (or pages) to keep; the KV manager decides where they live.
//
// Scores are attention mass per key token, already summed over the query heads of the KV
// head's GQA group (kernels::observation_scores() computes them for the last rows of a prompt
// from the flash kernel's per-row LSE). A "token index" is an index into the score array, i.e.
// into the head's current candidate tokens in position order: for a fresh prompt that is the
// position; during chunked prefill it is (kept tokens so far, then the new chunk).
//
// Ranking rule everywhere: by score descending, then index ascending ("the lower index wins" a
// tie); a keep-set takes the head of that order, an eviction its tail. NaN scores rank lowest.
// All returned index lists are sorted ascending.
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "sparsity/policy_spec.h"

namespace sieve::sparsity {

// The `k` best indices of `scores` by the ranking rule, sorted ascending (all when k >= size).
std::vector<int32_t> top_k_indices(std::span<const float> scores, int64_t k);

// StreamingLLM: the first num_sinks and the last window of num_tokens.
std::vector<int32_t> select_sink_window(int64_t num_tokens, const SinkWindowHead& head);

// SnapKV (and PyramidKV with its per-layer budget). scores: [n] mass each token receives from
// the observation window (the last head.window rows). The last `window` tokens are kept; the
// prefix [0, n - window) is smoothed by 1-D pooling (kernel pool_kernel, centered, over the
// in-range neighbours only: max, or mean of those present) and its top `budget` are kept.
// Everything is kept when n <= budget + window. Pooling runs over candidate order, so after
// earlier compression neighbours need not be adjacent positions. With head.follow = G > 0 the
// budget is spent best first, each chosen index bringing the G indices after it.
std::vector<int32_t> select_snapkv(std::span<const float> scores, const ObservationTopHead& head);
// The keep-set of a scored policy: the last `window` of num_keys keys, and the best `budget` of
// the others by candidate_scores ([num_keys - window], the ranking rule); with follow = G > 0
// the budget is spent best first, each chosen index bringing the G indices after it. Everything
// is kept when num_keys <= budget + window (candidate_scores unread).
struct ScoredBudget {
  int64_t budget = 0;
  int64_t window = 0;
  int64_t follow = 0;
};
std::vector<int32_t> select_scored(std::span<const float> candidate_scores, int64_t num_keys,
                                   const ScoredBudget& budget);
// The pooled prefix scores select_snapkv ranks ([n - window] values; empty when n <= window).
std::vector<float> pool_scores(std::span<const float> scores, const ObservationTopHead& head);

// H2O for one KV head: accumulated attention per kept token, updated every decode step.
// Budget: heavy_budget + window tokens; the most recent `window` kept tokens are never evicted;
// when over budget the lowest accumulated score among the others goes (ties: the higher
// position goes).
class HeavyHitterState {
 public:
  explicit HeavyHitterState(const HeavyHitterHead& head) : head_(head) {}

  // The prompt's tokens, positions ascending, with seed scores (e.g. observation scores of the
  // last rows; zeros are allowed). Keeps the top heavy_budget of all but the last `window` plus
  // those; returns the evicted positions (ascending). Replaces any earlier state.
  std::vector<int32_t> start(std::span<const int32_t> positions, std::span<const float> scores);

  // One decode step. attention: the new token's attention weights (summed over the group's
  // query heads) over kept_positions() in order, then over the new token itself (size
  // kept_positions().size() + 1). Adds them to the accumulated scores, appends new_position
  // (> every kept position) and evicts at most one token. Returns the evicted position.
  std::optional<int32_t> step(int32_t new_position, std::span<const float> attention);

  std::span<const int32_t> kept_positions() const { return positions_; }  // ascending
  std::span<const double> accumulated() const { return scores_; }         // parallel to it
  int64_t budget() const { return head_.heavy_budget + head_.window; }

 private:
  HeavyHitterHead head_;
  std::vector<int32_t> positions_;
  std::vector<double> scores_;
};

// FastGen. Per prompt token (candidate order), what the tokenizer says it is.
enum class TokenClass : uint8_t { kOther, kSpecial, kPunctuation };

// The candidate policies in cost order; each keeps a superset of the previous one.
enum class FastGenChoice : uint8_t {
  kSpecial,                    // special tokens
  kSpecialPunct,               // + punctuation
  kSpecialPunctLocal,          // + the last local_window tokens
  kSpecialPunctLocalFrequent,  // + the ceil(F * n) highest-scoring tokens not yet kept
  kFull,                       // everything
};
std::string_view to_string(FastGenChoice choice);

struct FastGenDecision {
  FastGenChoice choice = FastGenChoice::kFull;
  std::vector<int32_t> keep;  // ascending
  double recovery = 1.0;      // kept attention mass / total (1 when the total is 0)
};

// scores: [n] the head's attention mass from the profiling rows (the last local_window prompt
// rows) over the prompt; classes: [n]. Picks the cheapest candidate whose recovery ratio is
// >= 1 - threshold; FastGenState carries the choice on through generation.
FastGenDecision select_fastgen(std::span<const float> scores, std::span<const TokenClass> classes,
                               const FastGenPendingHead& head);

// FastGen during generation for one KV head, after select_fastgen(). A kept token stays while
// its class is one the choice keeps (special; punctuation from kSpecialPunct on), while it is in
// the local window (the local_window most recent positions, from kSpecialPunctLocal on), or
// while it is in the frequent set (kSpecialPunctLocalFrequent: the other tokens, at most
// ceil(F * n) for a prompt of n, ranked by attention accumulated from the prompt's scores
// through every decode step; when over, the lowest goes, ties: the higher position). kFull
// keeps everything. A new token is always attended (it is in the cache when its query runs),
// then dropped at once if nothing keeps it.
class FastGenState {
 public:
  // positions / classes / scores: the prompt in candidate order, as given to select_fastgen().
  FastGenState(const FastGenPendingHead& head, const FastGenDecision& decision,
               std::span<const int32_t> positions, std::span<const TokenClass> classes,
               std::span<const float> scores);

  // One decode step. attention: the new token's weights (summed over the group) over
  // kept_positions() in order, then itself. Returns the positions dropped now (ascending).
  std::vector<int32_t> step(int32_t new_position, TokenClass token_class,
                            std::span<const float> attention);

  FastGenChoice choice() const { return choice_; }
  std::span<const int32_t> kept_positions() const { return positions_; }  // ascending
  int64_t frequent_budget() const { return frequent_budget_; }

 private:
  bool kept_for_class(TokenClass token_class) const;

  FastGenChoice choice_;
  int64_t local_window_;
  int64_t frequent_budget_;
  std::vector<int32_t> positions_;
  std::vector<TokenClass> classes_;
  std::vector<double> scores_;  // accumulated attention, parallel to positions_
};

// Quest / LServe dynamic heads. page_bounds: [num_pages] an upper bound of the group's q·k over
// each page's keys (kernels::page_upper_bounds), num_pages = ceil(num_tokens / page_size). The
// pages holding the first max(num_sinks, 1) tokens and the last max(window, 1) tokens are always
// selected; the best others by the ranking rule fill up to top_k_pages. Returns logical page
// (block) indices, ascending; more than top_k_pages only when the forced pages alone are more.
std::vector<int32_t> select_pages(std::span<const float> page_bounds, int64_t num_tokens,
                                  int32_t page_size, const PageSelectHead& head);
// The pages select_pages() always selects (the sinks' and the window's), ascending.
std::vector<int32_t> forced_pages(int64_t num_tokens, int32_t page_size,
                                  const PageSelectHead& head);

// Calibration: the fraction of a head's attention mass (scores over n tokens) that falls on the
// first num_sinks and the last window tokens; 1 when the total is 0. The streaming score a
// calibration profile records (averaged over samples) is this.
double streaming_score(std::span<const float> scores, int64_t num_sinks, int64_t window);

}  // namespace sieve::sparsity
