#pragma once
// Self-speculation's draft view (speculative::Method::kSelfSparse): the target model drafts by
// reading a few of the sequence's own pages — no second copy of its KV — and the full cache
// verifies. This says which pages a draft row reads; the engine reads them in place.
//
//   block table   [ 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 ]   row at position p lives in block 7
//   streaming     [ 0 |                   | 6 | 7 ]   sinks + the blocks of the last W positions
//   quest K=4     [ 0 |   | 2 |           | 6 | 7 ]   forced (sinks, window) + best by q·k bound,
//                                                     chosen per (layer, KV head) by the model
#include <cstdint>
#include <optional>
#include <vector>

#include "sparsity/policy_spec.h"

namespace sieve::speculative {

// The draft kv_policies a self_sparse config may name: sink + window (streaming:S=..,W=..) or
// Quest page selection (quest:K=..,S=..,W=.., R = 1: a draft row chooses its own pages).
// Throws sieve::Error naming the policy otherwise.
void check_draft_policy(const sparsity::PolicySpec& policy);

// Quest: of DraftView::blocks, read `forced` plus the others with the highest q·k upper bounds,
// top_k in all (model::top_slices), chosen per (layer, KV head).
struct DraftPageChoice {
  int32_t top_k = 0;
  std::vector<int32_t> forced;  // ascending indices into DraftView::blocks (sinks', window's)
};

// What a draft row at `position` reads.
struct DraftView {
  std::vector<int32_t> blocks;  // block-table indices, ascending, the row's own block last
  std::optional<DraftPageChoice> choice;  // unset: read every one of `blocks`
};

// streaming: the blocks holding the first S positions and those holding [position - W + 1,
// position] (whole pages: a few more keys than S + W). quest: every block up to the row's own,
// with the choice of sparsity::forced_pages() for the position + 1 keys the row sees.
DraftView draft_view(const sparsity::PolicySpec& policy, int32_t position, int32_t page_size);

}  // namespace sieve::speculative
