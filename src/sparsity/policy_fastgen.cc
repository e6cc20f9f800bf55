// fastgen (FastGen): dense through the prompt; at its end, the cheapest of special / +punctuation /
// +local / +frequent / full that recovers enough of the profiling rows' attention
// (select_fastgen), carried on through generation by FastGenState.
#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

const Param<FastGenSpec> kFastGenParams[] = {
    {"T",
     &FastGenSpec::threshold,
     "choose a policy recovering >= 1 - T of the attention",
     {.min = 0.0, .max = 1.0, .max_open = true}},
    {"W", &FastGenSpec::local_window, "local window in tokens, also the profiling rows",
     AtLeast(1)},
    {"F", &FastGenSpec::frequent_fraction, "frequent set size as a fraction of the prompt",
     Fraction()},
};

class FastGenPolicy final : public CopyableStreamPolicy<FastGenPolicy> {
 public:
  explicit FastGenPolicy(const FastGenPendingHead& head) : head_(head) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override {
    return std::nullopt;  // the head may choose full
  }
  int64_t observation_rows() const override { return head_.local_window; }
  bool needs_token_classes() const override { return true; }

  CompressResult compress(const CompressInput& in) override {
    if (!in.prompt_done) return {};  // decides once, from the whole prompt
    // Until now the stream kept every key, so key indices are positions.
    std::vector<int32_t> positions(static_cast<size_t>(in.num_positions));
    for (int32_t i = 0; i < in.num_positions; ++i) positions[i] = i;
    const FastGenDecision decision = select_fastgen(in.scores, in.classes, head_);
    state_.emplace(head_, decision, positions, in.classes, in.scores);
    CompressResult result{.recovery = decision.recovery};
    if (decision.choice != FastGenChoice::kFull) result.keep = decision.keep;
    return result;
  }
  StreamReport report() const override {
    if (!state_) return {.kind = "fastgen:pending"};
    return {.kind = "fastgen:" + std::string(to_string(state_->choice()))};
  }

  bool acts_on_decode() const override {
    return state_ && state_->choice() != FastGenChoice::kFull;
  }
  bool wants_decode_attention() const override {
    return state_ && state_->choice() == FastGenChoice::kSpecialPunctLocalFrequent;
  }
  std::vector<int32_t> after_decode_step(const DecodeInput& in) override {
    if (!acts_on_decode()) return {};
    // Without weights (the choice ranks nothing by them) zeros stand in.
    std::vector<float> zeros;
    std::span<const float> weights = in.attention;
    if (weights.size() != state_->kept_positions().size() + 1) {
      zeros.assign(state_->kept_positions().size() + 1, 0.0f);
      weights = zeros;
    }
    const std::vector<int32_t> dropped = state_->step(in.new_position, in.new_class, weights);
    return key_indices_of_dropped(state_->kept_positions(), dropped);
  }

 private:
  FastGenPendingHead head_;
  std::optional<FastGenState> state_;
};

}  // namespace

const PolicyType& fastgen_policy_type() {
  static const LeafPolicy<FastGenSpec, FastGenPolicy> type("fastgen", kFastGenParams);
  return type;
}

}  // namespace sieve::sparsity
