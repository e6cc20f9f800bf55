// make_policy_groups(): which policy object runs each resolved head policy, and which streams
// decide together.
#include "sparsity/stream_policy.h"

#include <algorithm>

#include "sparsity/policies.h"

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

std::unique_ptr<StreamPolicy> make_stream_policy(const HeadPolicy& head) {
  struct Make {
    std::unique_ptr<StreamPolicy> operator()(const DenseHead&) const { return make_full_policy(); }
    std::unique_ptr<StreamPolicy> operator()(const SinkWindowHead& h) const {
      return make_sink_window_policy(h);
    }
    std::unique_ptr<StreamPolicy> operator()(const ObservationTopHead& h) const {
      return make_snapkv_policy(h);
    }
    std::unique_ptr<StreamPolicy> operator()(const HeavyHitterHead& h) const {
      return make_h2o_policy(h);
    }
    std::unique_ptr<StreamPolicy> operator()(const FastGenPendingHead& h) const {
      return make_fastgen_policy(h);
    }
    std::unique_ptr<StreamPolicy> operator()(const PageSelectHead& h) const {
      return make_page_select_policy(h);
    }
    std::unique_ptr<StreamPolicy> operator()(const SharedBudgetHead&) const {
      return nullptr;  // a group policy
    }
  };
  return std::visit(Make{}, head);
}

}  // namespace

std::vector<PolicyGroup> make_policy_groups(const SparsityPlan& plan) {
  std::vector<PolicyGroup> groups;
  // Ada-KV: the streams of one layer with the same shared-budget head form one group.
  std::vector<std::pair<SharedBudgetHead, size_t>> open_shared;  // this layer's: head, group
  int64_t open_layer = -1;
  for (size_t s = 0; s < plan.heads.size(); ++s) {
    const int64_t layer = static_cast<int64_t>(s) / plan.shape.num_kv_heads;
    if (layer != open_layer) {
      open_shared.clear();
      open_layer = layer;
    }
    if (const auto* shared = std::get_if<SharedBudgetHead>(&plan.heads[s])) {
      auto it = std::find_if(open_shared.begin(), open_shared.end(),
                             [&](const auto& g) { return g.first == *shared; });
      if (it == open_shared.end()) {
        groups.push_back({nullptr, {}});
        open_shared.emplace_back(*shared, groups.size() - 1);
        it = open_shared.end() - 1;
      }
      groups[it->second].streams.push_back(static_cast<int32_t>(s));
      continue;
    }
    groups.push_back({std::make_unique<SingleStream>(make_stream_policy(plan.heads[s])),
                      {static_cast<int32_t>(s)}});
  }
  for (PolicyGroup& group : groups) {
    if (!group.policy) {
      group.policy = make_shared_budget_policy(
          std::get<SharedBudgetHead>(plan.heads[static_cast<size_t>(group.streams[0])]),
          group.streams.size());
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
