// Quest / LServe dynamic heads: every key stays (no memory is freed); each decode row reads the
// pages select_pages() picks by q·k upper bounds, a choice reused for R steps. The engine's
// model runner keeps the per-page key summaries and asks select_pages() at run time.
#include "sparsity/policies.h"

namespace sieve::sparsity {

namespace {

class PageSelectPolicy final : public CopyableStreamPolicy<PageSelectPolicy> {
 public:
  explicit PageSelectPolicy(const PageSelectHead& head) : head_(head) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override { return std::nullopt; }
  std::optional<PageSelectHead> page_selection() const override { return head_; }
  CompressResult compress(const CompressInput&) override { return {}; }

 private:
  PageSelectHead head_;
};

}  // namespace

std::unique_ptr<StreamPolicy> make_page_select_policy(const PageSelectHead& head) {
  return std::make_unique<PageSelectPolicy>(head);
}

}  // namespace sieve::sparsity
