// snapkv (SnapKV): at each compression point, the top-B keys by pooled observation-window score
// plus the window; generated tokens are appended and kept. PyramidKV's per-layer heads are
// snapkv heads too.
#include "sparsity/policy_scored.h"

namespace sieve::sparsity {

namespace {

const Param<SnapKvSpec> kParams[] = {
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

class SnapKvPolicy final : public CopyableStreamPolicy<SnapKvPolicy> {
 public:
  explicit SnapKvPolicy(const ObservationTopHead& head) : head_(head) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t max_new_tokens) const override {
    return head_.budget + head_.window + max_new_tokens;
  }
  int64_t observation_rows() const override { return head_.window; }
  CompressResult compress(const CompressInput& in) override {
    std::vector<int32_t> keep = select_snapkv(in.scores, head_);
    const double recovery = kept_mass_ratio(in.scores, keep);
    return {.keep = std::move(keep), .recovery = recovery};
  }
  StreamReport report() const override { return {.kind = "snapkv"}; }

 private:
  ObservationTopHead head_;
};

}  // namespace

std::string_view Scored<SnapKvSpec>::name() { return "snapkv"; }
std::span<const Param<SnapKvSpec>> Scored<SnapKvSpec>::params() { return kParams; }

const PolicyType& snapkv_policy_type() {
  static const LeafPolicy<SnapKvSpec, SnapKvPolicy> type("snapkv", kParams,
                                                         "snapkv:B={budget},W={window}");
  return type;
}

}  // namespace sieve::sparsity
