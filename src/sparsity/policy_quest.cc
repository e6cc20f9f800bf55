// quest (Quest), and LServe's dynamic heads: every key stays (no memory is freed); each decode row
// reads the `forced` slices (sinks, window) plus the best others by q·k upper bounds (the model
// computes them from per-slice key summaries), top_k in all, a choice reused for R decode steps:
// until then the row reads the chosen slices plus every slice started since.
#include <algorithm>

#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

const Param<QuestSpec> kQuestParams[] = {
    {"K", &QuestSpec::top_k_pages, "pages read per decode step", AtLeast(1), Presence::kRequired},
    {"R", &QuestSpec::reuse_steps, "decode steps one selection is used for", AtLeast(1)},
    {"S", &QuestSpec::num_sinks, "pages holding the first S tokens are always read"},
    {"W", &QuestSpec::window, "pages holding the last W tokens are always read"},
    {"B",
     &QuestSpec::key_bits,
     "bits per key and channel that tighten a page's bound (0: the page's min/max, as Quest; 1: "
     "each key's half of the page's range as well)",
     {.min = 0, .max = 1},
     Presence::kUnlessDefault},
};

int32_t num_slices(int32_t num_keys, int32_t page_size) {
  return (num_keys + page_size - 1) / page_size;
}

class PageSelectPolicy final : public CopyableStreamPolicy<PageSelectPolicy> {
 public:
  explicit PageSelectPolicy(const PageSelectHead& head) : head_(head) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override { return std::nullopt; }
  bool selects_pages() const override { return true; }
  CompressResult compress(const CompressInput&) override { return {}; }
  StreamReport report() const override {
    if (chosen_.empty()) return {.kind = "quest"};
    return {.kind = "quest", .pages_read = static_cast<int32_t>(chosen_.size())};
  }

  std::optional<PageReads> decode_reads(int32_t num_keys, int32_t page_size) const override {
    PageReads reads;
    // On reuse steps too: the summaries kept for the next choice keep their layout.
    reads.key_halves = head_.key_bits > 0;
    if (chosen_.empty() || num_decode_steps_ % head_.reuse_steps == 0) {
      reads.choose = true;
      reads.top_k = static_cast<int32_t>(head_.top_k_pages);
      reads.forced = forced_pages(num_keys, page_size, head_);
      return reads;
    }
    // The last choice, then every slice from the one that was newest at the choice on.
    reads.reuse = chosen_;
    const int32_t first_new = std::max(num_slices(keys_at_choice_, page_size) - 1, 0);
    for (int32_t b = first_new; b < num_slices(num_keys, page_size); ++b) {
      if (reads.reuse.empty() || b > reads.reuse.back()) reads.reuse.push_back(b);
    }
    return reads;
  }
  bool acts_on_decode() const override { return true; }
  std::vector<int32_t> after_decode_step(const DecodeInput& in) override {
    if (!in.chosen_slices.empty()) {
      chosen_.assign(in.chosen_slices.begin(), in.chosen_slices.end());
      keys_at_choice_ = in.num_keys;
    }
    ++num_decode_steps_;
    return {};
  }

 private:
  PageSelectHead head_;
  std::vector<int32_t> chosen_;  // the last choice's slices
  int32_t keys_at_choice_ = 0;   // the stream's keys at that step
  int64_t num_decode_steps_ = 0;
};

}  // namespace

std::span<const Param<QuestSpec>> quest_params() { return kQuestParams; }

const PolicyType& quest_policy_type() {
  static const LeafPolicy<QuestSpec, PageSelectPolicy> type("quest", kQuestParams,
                                                            "quest:K={pages},R=1,S=4,W={window}");
  return type;
}

}  // namespace sieve::sparsity
