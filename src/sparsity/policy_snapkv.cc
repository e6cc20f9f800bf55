// SnapKV / PyramidKV: at each compression point, the top-B keys by pooled observation-window
// score plus the window; generated tokens are appended and kept.
#include "sparsity/policies.h"

namespace sieve::sparsity {

namespace {

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

std::unique_ptr<StreamPolicy> make_snapkv_policy(const ObservationTopHead& head) {
  return std::make_unique<SnapKvPolicy>(head);
}

}  // namespace sieve::sparsity
