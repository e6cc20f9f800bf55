// make_policy_groups(): which policy object runs each resolved head policy, and which streams
// decide together.
#include "sparsity/stream_policy.h"

#include <algorithm>

#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

// A StreamPolicy as a group of one.
class SingleStream final : public GroupPolicy {
 public:
  explicit SingleStream(std::unique_ptr<StreamPolicy> policy) : policy_(std::move(policy)) {}
  std::unique_ptr<GroupPolicy> clone() const override {
    return std::make_unique<SingleStream>(policy_->clone());
  }
  size_t num_members() const override { return 1; }
  std::optional<int64_t> max_kept_tokens(size_t, int64_t prompt_tokens,
                                         int64_t max_new_tokens) const override {
    return policy_->max_kept_tokens(prompt_tokens, max_new_tokens);
  }
  int64_t observation_rows() const override { return policy_->observation_rows(); }
  bool needs_token_classes() const override { return policy_->needs_token_classes(); }
  bool needs_keys() const override { return policy_->needs_keys(); }
  bool is_dense() const override { return policy_->is_dense(); }
  bool selects_pages(size_t) const override { return policy_->selects_pages(); }
  std::optional<PageReads> decode_reads(size_t, int32_t num_keys,
                                        int32_t page_size) const override {
    return policy_->decode_reads(num_keys, page_size);
  }
  void compress(std::span<const CompressInput> in, std::span<CompressResult> out) override {
    out[0] = policy_->compress(in[0]);
  }
  StreamReport report(size_t) const override { return policy_->report(); }
  bool acts_on_decode() const override { return policy_->acts_on_decode(); }
  bool wants_decode_attention(size_t) const override { return policy_->wants_decode_attention(); }
  void after_decode_step(std::span<const DecodeInput> in,
                         std::span<std::vector<int32_t>> drops) override {
    drops[0] = policy_->after_decode_step(in[0]);
  }

 private:
  std::unique_ptr<StreamPolicy> policy_;
};

}  // namespace

std::unique_ptr<GroupPolicy> single_stream(std::unique_ptr<StreamPolicy> policy) {
  return std::make_unique<SingleStream>(std::move(policy));
}

std::vector<PolicyGroup> make_policy_groups(const SparsityPlan& plan) {
  std::vector<PolicyGroup> groups;
  std::vector<PolicySpec> group_heads;  // [group]
  // Policies deciding per layer (Ada-KV): this layer's groups, by head.
  std::vector<size_t> open_groups;
  int64_t open_layer = -1;
  for (size_t s = 0; s < plan.heads.size(); ++s) {
    const int64_t layer = static_cast<int64_t>(s) / plan.shape.num_kv_heads;
    if (layer != open_layer) {
      open_groups.clear();
      open_layer = layer;
    }
    PolicySpec head = std::visit([](const auto& h) { return PolicySpec{h}; }, plan.heads[s]);
    const PolicyType& type = policy_type(head);
    if (type.decides_per_layer()) {
      auto it = std::find_if(open_groups.begin(), open_groups.end(),
                             [&](size_t g) { return group_heads[g] == head; });
      if (it == open_groups.end()) {
        groups.push_back({nullptr, {}});
        group_heads.push_back(std::move(head));
        open_groups.push_back(groups.size() - 1);
        it = open_groups.end() - 1;
      }
      groups[*it].streams.push_back(static_cast<int32_t>(s));
      continue;
    }
    groups.push_back({type.make_group(head, 1), {static_cast<int32_t>(s)}});
    group_heads.push_back(std::move(head));
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].policy) {
      groups[g].policy =
          policy_type(group_heads[g]).make_group(group_heads[g], groups[g].streams.size());
    }
  }
  return groups;
}

std::vector<int32_t> key_indices_of_dropped(std::span<const int32_t> kept_after,
                                            std::span<const int32_t> dropped) {
  // A dropped key's index is its rank among all the keys: the kept positions below it plus
  // the dropped ones below it.
  std::vector<int32_t> indices(dropped.size());
  for (size_t j = 0; j < dropped.size(); ++j) {
    indices[j] =
        static_cast<int32_t>(std::lower_bound(kept_after.begin(), kept_after.end(), dropped[j]) -
                             kept_after.begin() + static_cast<ptrdiff_t>(j));
  }
  return indices;
}

double kept_mass_ratio(std::span<const float> scores, std::span<const int32_t> keep) {
  double total = 0.0, kept = 0.0;
  for (float score : scores) total += score;
  for (int32_t i : keep) kept += scores[i];
  return total > 0 ? kept / total : 1.0;
}

}  // namespace sieve::sparsity
