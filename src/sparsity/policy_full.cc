// full: the stream keeps every key and every row reads all of them.
#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

class FullPolicy final : public CopyableStreamPolicy<FullPolicy> {
 public:
  explicit FullPolicy(const FullSpec&) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override { return std::nullopt; }
  bool is_dense() const override { return true; }
  CompressResult compress(const CompressInput&) override { return {}; }
  StreamReport report() const override { return {.kind = "full"}; }
};

}  // namespace

const PolicyType& full_policy_type() {
  static const LeafPolicy<FullSpec, FullPolicy> type("full", {}, "full");
  return type;
}

}  // namespace sieve::sparsity
