// adakv (Ada-KV, adaptive budget allocation over a scored policy, snapkv by default): the KV heads
// of a layer share one budget of num_heads * B prompt keys outside their observation windows. Heads
// whose attention is concentrated need few keys and leave the rest to heads whose attention is
// spread, so the layer keeps more of its attention mass than SnapKV's equal per-head budgets. Each
// head keeps at least floor(alpha * B) of its own best (the paper's safeguard); the rest of the
// budget goes to the best scores of all the heads together. Scores must be comparable across
// heads: snapkv's are (each head's observation rows spread the same mass, window rows x query
// heads, over its keys).
#include <algorithm>
#include <cmath>

#include "sparsity/policy_scored.h"

namespace sieve::sparsity {

namespace {

const Param<AdaKvSpec> kAdaKvParams[] = {
    {"alpha", &AdaKvSpec::alpha, "each head keeps at least floor(alpha * B) of its best",
     Fraction()},
};
// Ada-KV ranks scores across its heads: no G.
constexpr std::string_view kScoredExcept[] = {"G"};

struct Candidate {
  float score;
  int32_t member;
  int32_t index;
};

// The ranking rule of selection.h across heads: score descending (NaN lowest), then member,
// then index ascending.
bool ranks_before(const Candidate& a, const Candidate& b) {
  const bool a_nan = std::isnan(a.score), b_nan = std::isnan(b.score);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a.score != b.score) return a.score > b.score;
  if (a.member != b.member) return a.member < b.member;
  return a.index < b.index;
}

class SharedBudgetPolicy final : public GroupPolicy {
 public:
  SharedBudgetPolicy(const SharedBudgetHead& head, size_t num_members)
      : head_(head), scorer_(make_scorer(head.scored)), num_members_(num_members) {}
  std::unique_ptr<GroupPolicy> clone() const override {
    return std::make_unique<SharedBudgetPolicy>(*this);
  }
  size_t num_members() const override { return num_members_; }

  std::optional<int64_t> max_kept_tokens(size_t, int64_t, int64_t max_new_tokens) const override {
    // One head may take everything the others leave above their floors.
    const auto others = static_cast<int64_t>(num_members_) - 1;
    return static_cast<int64_t>(num_members_) * scored_budget(head_.scored) -
           others * floor_keys() + scored_window(head_.scored) + max_new_tokens;
  }
  int64_t observation_rows() const override { return scorer_->observation_rows(); }
  bool needs_keys() const override { return scorer_->needs_keys(); }

  void compress(std::span<const CompressInput> in, std::span<CompressResult> out) override {
    std::vector<std::vector<float>> pooled(in.size());  // each stream's scorer's scores
    int64_t num_candidates = 0;
    for (size_t m = 0; m < in.size(); ++m) {
      pooled[m] = scorer_->score(in[m]);
      num_candidates += static_cast<int64_t>(pooled[m].size());
    }
    const int64_t shared_budget = static_cast<int64_t>(in.size()) * scored_budget(head_.scored);
    std::vector<std::vector<int32_t>> chosen(in.size());
    if (num_candidates <= shared_budget) {
      for (size_t m = 0; m < in.size(); ++m) {
        for (int32_t i = 0; i < static_cast<int32_t>(pooled[m].size()); ++i) chosen[m].push_back(i);
      }
    } else {
      // Each head's floor from its own ranking, then the rest of the budget over all heads.
      int64_t left = shared_budget;
      std::vector<std::vector<uint8_t>> taken(in.size());
      for (size_t m = 0; m < in.size(); ++m) {
        chosen[m] = top_k_indices(pooled[m], floor_keys());
        taken[m].assign(pooled[m].size(), 0);
        for (int32_t i : chosen[m]) taken[m][i] = 1;
        left -= static_cast<int64_t>(chosen[m].size());
      }
      std::vector<Candidate> rest;
      for (size_t m = 0; m < in.size(); ++m) {
        for (int32_t i = 0; i < static_cast<int32_t>(pooled[m].size()); ++i) {
          if (!taken[m][i]) rest.push_back({pooled[m][i], static_cast<int32_t>(m), i});
        }
      }
      left = std::min<int64_t>(left, static_cast<int64_t>(rest.size()));
      std::partial_sort(rest.begin(), rest.begin() + left, rest.end(), ranks_before);
      for (int64_t k = 0; k < left; ++k) chosen[rest[k].member].push_back(rest[k].index);
    }
    for (size_t m = 0; m < in.size(); ++m) {
      std::vector<int32_t>& keep = chosen[m];
      std::sort(keep.begin(), keep.end());
      // The observation window (the last W keys) is always kept.
      for (auto i = static_cast<int32_t>(pooled[m].size()); i < in[m].num_keys; ++i)
        keep.push_back(i);
      if (!in[m].scores.empty()) out[m].recovery = kept_mass_ratio(in[m].scores, keep);
      out[m].keep = std::move(keep);
    }
  }
  StreamReport report(size_t) const override { return {.kind = "adakv"}; }

 private:
  int64_t floor_keys() const {
    return static_cast<int64_t>(
        std::floor(head_.alpha * static_cast<double>(scored_budget(head_.scored))));
  }

  SharedBudgetHead head_;
  std::shared_ptr<const KeyScorer> scorer_;  // stateless: shared by copies
  size_t num_members_;
};

class AdaKvType final : public ScoredWrapper<AdaKvSpec> {
 public:
  AdaKvType() : ScoredWrapper(kAdaKvParams, kScoredExcept) {}
  std::string_view name() const override { return "adakv"; }
  bool decides_per_layer() const override { return true; }
  std::string_view budget_pattern() const override { return "adakv:B={budget},W={window}"; }

 protected:
  std::unique_ptr<GroupPolicy> make_group_for(const AdaKvSpec& head,
                                              size_t num_members) const override {
    return std::make_unique<SharedBudgetPolicy>(head, num_members);
  }
};

}  // namespace

const PolicyType& adakv_policy_type() {
  static const AdaKvType type;
  return type;
}

}  // namespace sieve::sparsity
