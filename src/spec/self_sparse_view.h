#pragma once
// Self-speculation's draft view (spec::Method::kSelfSparse): the target model drafts by reading a
// few of the sequence's own pages — no second copy of its KV — and the full cache verifies. This
// says which pages a draft row reads; the engine reads them in place.
#include <cstdint>
#include <vector>

#include "sparsity/policy_spec.h"

namespace sieve::spec {

// The draft kv_policies a self_sparse config may name: sink + window (streaming:S=..,W=..).
// Throws sieve::Error naming the policy otherwise.
void check_draft_policy(const sparsity::PolicySpec& policy);

// Block-table indices (ascending) a draft row at `position` reads under `policy`: the pages
// holding the first S positions and those holding positions [position - W + 1, position], so
// the row's own page comes last. Whole pages: a few more keys than S + W.
std::vector<int32_t> draft_view_blocks(const sparsity::PolicySpec& policy, int32_t position,
                                       int32_t page_size);

}  // namespace sieve::spec
