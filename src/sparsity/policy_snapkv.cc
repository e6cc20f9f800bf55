// snapkv (SnapKV): at each compression point, the top-B keys by pooled observation-window score
// plus the window; generated tokens are appended and kept (ScoredPolicy). PyramidKV's per-layer
// heads are snapkv heads too, and snapkv is the scorer Ada-KV ranks by unless told otherwise.
#include "sparsity/policy_scored.h"

namespace sieve::sparsity {

namespace {

const Param<SnapKvSpec> kSnapKvParams[] = {
    {"B", &SnapKvSpec::budget, "the token budget", AtLeast(1), Presence::kRequired},
    {"W", &SnapKvSpec::window, "the observation window: the last W prompt tokens, always kept",
     AtLeast(1)},
    {"P", &SnapKvSpec::pool_kernel, "pooling kernel (1 = no pooling)", {.min = 1, .odd = true}},
    {"pool", &SnapKvSpec::pooling, "pooling: max or avg"},
    {"G",
     &SnapKvSpec::follow,
     "each selected key brings the G prompt tokens after it",
     {},
     Presence::kUnlessDefault},
};

// Pooled observation-window attention.
class ObservationScorer final : public KeyScorer {
 public:
  explicit ObservationScorer(const SnapKvSpec& spec) : spec_(spec) {}
  int64_t observation_rows() const override { return spec_.window; }
  std::vector<float> score(const CompressInput& in) const override {
    return pool_scores(in.scores, spec_);
  }

 private:
  SnapKvSpec spec_;
};

}  // namespace

std::string_view Scored<SnapKvSpec>::name() { return "snapkv"; }
std::span<const Param<SnapKvSpec>> Scored<SnapKvSpec>::params() { return kSnapKvParams; }
std::shared_ptr<const KeyScorer> Scored<SnapKvSpec>::scorer(const SnapKvSpec& spec) {
  return std::make_shared<ObservationScorer>(spec);
}

const PolicyType& snapkv_policy_type() {
  static const LeafPolicy<SnapKvSpec, ScoredPolicy> type("snapkv", kSnapKvParams,
                                                         "snapkv:B={budget},W={window}");
  return type;
}

}  // namespace sieve::sparsity
