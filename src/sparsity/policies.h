#pragma once
// The policy objects' factories (one per policy_*.cc) and helpers they share; only
// stream_policy.cc's make_policy_groups() and the policies include this.
#include <memory>
#include <span>
#include <vector>

#include "sparsity/stream_policy.h"

namespace sieve::sparsity {

std::unique_ptr<StreamPolicy> make_full_policy();
std::unique_ptr<StreamPolicy> make_sink_window_policy(const SinkWindowHead& head);
std::unique_ptr<StreamPolicy> make_snapkv_policy(const ObservationTopHead& head);
std::unique_ptr<StreamPolicy> make_h2o_policy(const HeavyHitterHead& head);
std::unique_ptr<StreamPolicy> make_fastgen_policy(const FastGenPendingHead& head);
std::unique_ptr<StreamPolicy> make_page_select_policy(const PageSelectHead& head);
// One layer's streams holding `head` (Ada-KV).
std::unique_ptr<GroupPolicy> make_shared_budget_policy(const SharedBudgetHead& head,
                                                       size_t num_members);

// The attention mass of scores[keep] over all of it; 1 when the total is 0.
double kept_mass_ratio(std::span<const float> scores, std::span<const int32_t> keep);

}  // namespace sieve::sparsity
