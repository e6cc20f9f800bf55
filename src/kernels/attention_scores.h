#pragma once
// Scores for KV sparsity, read from the paged KV cache (layout: paged_attention.h). They hand
// back numbers; which tokens or pages to keep is decided in src/sparsity/.
//
// (a) observation_scores(): how much attention each key token receives from the last α query
//     rows of a prompt (SnapKV / PyramidKV / FastGen / H2O seeds). It reuses the per-row
//     log-sum-exp the flash kernel returned for those rows (AttentionOutput::row_lse), so
//     p = exp(scale * q·k - lse) is the exact softmax probability without a second max/sum
//     pass, and it only visits the α rows: cost α * group * num_keys * head_dim multiply-adds
//     per KV head (n·α, not n²), K read once per key.
// (b) Page key summaries: per page, per KV head, per channel min and max of the keys in its
//     filled slots (Quest). Kept current with one extend_page_key_summary() per written key.
//     Optionally (key halves) one bit per key and channel more: whether the key lies in the
//     upper half of the page's [min, max] of that channel.
// (c) page_upper_bounds(): per page, an upper bound of q·k over its keys from the summaries:
//     sum_c max(q_c * min_c, q_c * max_c) >= q·k for every key k of the page. With key halves,
//     each key's bound over its own halves, and the page's largest: never looser, still >= q·k.
//     Why: min/max over a page says nothing when every channel takes both signs somewhere in
//     the page (keys that are codes of independent signs, as a copy head's are); one bit per
//     channel tells the key that matches q in every channel from the others.
//
// GQA: every result is per KV head, summed over the query heads of its group.
//
// All key reads go through one gather (cpu/attention_scores.cc: GatherKeys; ref: key_row), so
// that another KV dtype only changes that place. Every KV dtype of paged_attention.h is read,
// Q8_0 / Q4_1 rows dequantized there: scores, summaries and bounds are those of the keys the
// attention sees.
#include <cstdint>

#include "kernels/paged_attention.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::kernels {

// (a) For t < num_keys and each kv head:
//   scores[kv_head * num_keys + t] =
//       sum over rows i with positions[i] >= t, query heads h of kv_head's group:
//           exp(window.scale * q[i][h]·k_t - row_lse[i * num_heads + h])
// (block pools: exp(q'·k_t - lse) with q' = block_kv_query(q[i][h], scale), as paged_attention)
// window: the α rows (q, positions, num_heads, scale) exactly as given to paged_attention();
// row_lse: [α][num_heads] as paged_attention() returned it for them. num_keys <= the block
// table's capacity; every key < num_keys that some row sees must be in the pages (keys no row
// sees get 0 and are not read). Deterministic: each key's sum is formed in a fixed order.
// Parallel on `pool` over (kv head, key chunk).
void observation_scores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                        int64_t num_keys, float* scores, ThreadPool& pool);

// (b) One layer's key summaries, indexed by page id (a page's summary describes its contents,
// so pages shared through the prefix cache share it). With F = key_summary_floats():
//   page p, kv head h:  min[c] at data[p * page_stride + h * F + c]
//                       max[c] at data[p * page_stride + h * F + head_dim + c]
//   key halves:         channel c's bits from byte 4 * (2 * head_dim) + c * key_half_bytes() of
//                       that head's floats; bit j % 8 of byte j / 8 is slot j (1: the key is
//                       above (min[c] + max[c]) / 2 in float). Unfilled slots repeat slot 0's.
//                       Channel-major, so that a vector of slots is bounded at once.
struct KeySummaries {
  float* data = nullptr;
  // Floats between pages, >= num_kv_heads * F; or 0 with one kv head: every page shares the
  // floats at data (summarize one page into a caller's buffer, e.g. summaries kept per logical
  // block rather than per page id).
  int64_t page_stride = 0;
  bool key_halves = false;
};
// Bytes of one channel's half bits (a bit per slot of the page).
constexpr int64_t key_half_bytes(int64_t page_size) { return (page_size + 7) / 8; }
// Floats of one page's summary for one kv head.
constexpr int64_t key_summary_floats(int64_t head_dim, int64_t page_size, bool key_halves) {
  return 2 * head_dim + (key_halves ? (head_dim * key_half_bytes(page_size) + 3) / 4 : 0);
}

// Recomputes the summary of logical block `block` (page kv.block_table[block]) from its slots
// [0, num_filled), 1 <= num_filled <= page_size, for every kv head.
void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                         const KeySummaries& summaries);
// Folds the key at `position` into its page's summary, every kv head; slot 0 starts the
// summary afresh. Calling it for positions 0, 1, ..., n - 1 in order equals summarizing. (With
// key halves a new key can move the page's midpoints: the page's filled slots are summarized
// again.)
void extend_page_key_summary(const PagedKv& kv, int64_t position, const KeySummaries& summaries);

// (c) bounds[kv_head * num_blocks + b] = sum over query heads h of kv_head's group of
//   sum_c max(q[h][c] * min_c, q[h][c] * max_c)   (min/max of block b's page)
// for blocks b < num_blocks. With key halves: the largest over the page's slots j of the same
// sum with [min_c, max_c] narrowed to slot j's half (mid_c = (min_c + max_c) / 2 in float). q:
// [num_heads][head_dim] one decode row, unscaled (a positive scale does not change the ranking).
// The summaries of those pages must be current.
void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                       int64_t num_heads, int64_t num_blocks, float* bounds);

namespace ref {
// Plain loops in double; the definitions of correct.
void observation_scores(const PagedKv& kv, const AttentionQuery& window, const float* row_lse,
                        int64_t num_keys, float* scores);
void summarize_page_keys(const PagedKv& kv, int64_t block, int64_t num_filled,
                         const KeySummaries& summaries);
void page_upper_bounds(const PagedKv& kv, const KeySummaries& summaries, const float* q,
                       int64_t num_heads, int64_t num_blocks, float* bounds);
}  // namespace ref

}  // namespace sieve::kernels
