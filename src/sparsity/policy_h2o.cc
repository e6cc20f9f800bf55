// h2o (H2O, heavy hitters): observation scores seed each key's accumulated attention at every
// compression point; each decode step adds the new row's weights and evicts at most one key,
// the lowest outside the recent window (HeavyHitterState).
#include <algorithm>

#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

const Param<H2OSpec> kH2OParams[] = {
    {"B", &H2OSpec::heavy_budget, "the heavy-hitter budget in tokens", AtLeast(1),
     Presence::kRequired},
    {"W", &H2OSpec::window, "the most recent W tokens are never evicted"},
};

class HeavyHitterPolicy final : public CopyableStreamPolicy<HeavyHitterPolicy> {
 public:
  explicit HeavyHitterPolicy(const HeavyHitterHead& head) : head_(head) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override {
    return head_.heavy_budget + head_.window + 1;  // + the new token before its step evicts
  }
  int64_t observation_rows() const override { return std::max<int64_t>(head_.window, 1); }

  CompressResult compress(const CompressInput& in) override {
    // The current keys in position order: those kept so far, then the new positions.
    std::vector<int32_t> positions;
    if (state_) positions.assign(state_->kept_positions().begin(), state_->kept_positions().end());
    for (int32_t p = in.first_new_position; p < in.num_positions; ++p) positions.push_back(p);
    state_.emplace(head_);
    state_->start(positions, in.scores);
    std::vector<int32_t> keep;
    for (int32_t p : state_->kept_positions()) {
      keep.push_back(static_cast<int32_t>(std::lower_bound(positions.begin(), positions.end(), p) -
                                          positions.begin()));
    }
    const double recovery = kept_mass_ratio(in.scores, keep);
    return {.keep = std::move(keep), .recovery = recovery};
  }
  StreamReport report() const override { return {.kind = "heavy_hitters"}; }

  bool acts_on_decode() const override { return true; }
  bool wants_decode_attention() const override { return state_.has_value(); }
  std::vector<int32_t> after_decode_step(const DecodeInput& in) override {
    if (!state_ || in.attention.empty()) return {};
    const std::optional<int32_t> evicted = state_->step(in.new_position, in.attention);
    if (!evicted) return {};
    return key_indices_of_dropped(state_->kept_positions(), std::span<const int32_t>(&*evicted, 1));
  }

 private:
  HeavyHitterHead head_;
  std::optional<HeavyHitterState> state_;
};

}  // namespace

const PolicyType& h2o_policy_type() {
  static const LeafPolicy<H2OSpec, HeavyHitterPolicy> type("h2o", kH2OParams,
                                                           "h2o:B={budget},W={window}");
  return type;
}

}  // namespace sieve::sparsity
