// full: the stream keeps every key and every row reads all of them.
#include "sparsity/policies.h"

namespace sieve::sparsity {

namespace {

class FullPolicy final : public CopyableStreamPolicy<FullPolicy> {
 public:
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override { return std::nullopt; }
  bool is_dense() const override { return true; }
  CompressResult compress(const CompressInput&) override { return {}; }
  StreamReport report() const override { return {.kind = "full"}; }
};

}  // namespace

std::unique_ptr<StreamPolicy> make_full_policy() { return std::make_unique<FullPolicy>(); }

}  // namespace sieve::sparsity
