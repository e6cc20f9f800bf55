#pragma once
// Internal to src/kernels: how paged_attention() splits its work, and the target its dispatch
// table resolves to. Target-independent; the per-target kernels are in cpu/attention-inl.h.
//
// A task is (query-row tile, range of kv heads, key range). Its query vectors are the tile's
// rows x the query heads of its kv heads (GQA groups); all of a kv head's query vectors run
// against each K/V tile that is loaded, so each K/V element is read once per task. Prefill
// tiles take one kv head each; decode (one row) takes several kv heads per task, so that it
// walks each page through all of their heads (a page holds the heads one after another; on
// Zen 4, reading one head's 8 KiB slice of every page in turn streams at half the rate of
// page-by-page order in a plain read loop, and decode ran ~12% faster this way; the kernel's
// tiles are then one page long, see TileKeys in attention-inl.h). A tile's
// key range is [0, max position + 1), cut into pieces whose partial (max, sum, acc) states a
// merge step combines, so that the threads are busy (decode, short chunks over long contexts):
// for short jobs at fixed multiples of kAttentionSplitKeys (then a row's output does not depend
// on the rows, heads or threads of its job), for prefill chunks only as the threads need.
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kernels/paged_attention.h"

namespace sieve::kernels {

// Query vectors (rows x query heads) per task: the accumulators ([32][head_dim] f32, 16 KiB at
// head_dim 128) and staged queries stay in L1/L2 while each K/V tile is reused by all of them.
inline constexpr int64_t kAttentionQueryVectorsPerTask = 32;
// Longer jobs (prefill chunks) take more per task: each K/V tile, read from L2/L3 and (AVX-512)
// transposed, is then shared by 8x the query vectors (a 512-row chunk of bench-engine's model at
// 16k keys, f32: 32 -> 128 -> 256 vectors 139 -> 200 -> 227-237 GFLOP/s; 512: 202-237).
inline constexpr int64_t kAttentionLongJobQueryVectorsPerTask = 256;
// Jobs of at most this many query rows (decode, a speculative verification of up to 16 drafts)
// are planned so that each row's output is bit for bit the one it gets alone: keys cut at fixed
// multiples of kAttentionSplitKeys (whole pages), whatever the rows, heads or threads, and every
// task walking page-long tiles (attention-inl.h). Longer jobs (prefill chunks) split only to
// keep the threads busy (below) and take 2-page tiles: fixed 512-key pieces cost prefill on the
// generated 57M model 0.7-0.8x (f16 KV, 2k / 16k prompts), and page-long tiles ~0.9x.
inline constexpr int64_t kAttentionInvariantRows = 32;
inline constexpr int64_t kAttentionSplitKeys = 512;
// The pieces' length for a pool of `page_size`-key pages: kAttentionSplitKeys in whole pages.
inline int64_t attention_split_keys(int64_t page_size) {
  return (kAttentionSplitKeys + page_size - 1) / page_size * page_size;
}
// Longer jobs: split keys when there are fewer than this many tasks per thread...
inline constexpr int64_t kAttentionTasksPerThread = 4;
// ...but no split task reads less than this much K+V: it would cost more in task overhead and
// merging than it gains.
inline constexpr int64_t kAttentionMinTaskBytes = 256 << 10;

struct AttentionTask {
  int64_t row_begin = 0, row_end = 0;          // query rows [row_begin, row_end)
  int64_t kv_head_begin = 0, kv_head_end = 0;  // kv heads [kv_head_begin, kv_head_end)
  int64_t key_begin = 0, key_end = 0;          // key positions [key_begin, key_end)
  // Set when the keys are split: the task stores its partial state in this slot of the
  // partials buffer and merges write the output. Unset: the task writes the output.
  std::optional<int64_t> partial_slot;
};

// The key splits of one (row tile, kv head): slots [first_slot, first_slot + num_slots), each
// holding the kv head as head number `head_in_slot` of its task.
struct AttentionMerge {
  int64_t row_begin = 0, row_end = 0;
  int64_t kv_head = 0;
  int64_t head_in_slot = 0;
  int64_t first_slot = 0, num_slots = 0;
};

struct AttentionPlan {
  int64_t rows_per_tile = 1;           // query rows per task (the last tile may have fewer)
  int64_t max_query_vectors = 0;       // per task: rows x kv heads x group, at most
  std::vector<AttentionTask> tasks;    // costliest first (better balance when run dynamically)
  std::vector<AttentionMerge> merges;  // empty when nothing was split
  int64_t num_slots = 0;               // partial slots the split tasks use
  int64_t total_macs = 0;              // q·k + p·v multiply-adds over all tasks
  // The job has at most kAttentionInvariantRows rows: fixed pieces and page-long tiles.
  bool row_invariant = false;
};

// The work split for `num_threads` threads. Pure function of the shapes and positions.
AttentionPlan plan_paged_attention(const PagedKv& kv, const AttentionQuery& q, int num_threads);

std::string_view paged_attention_target_name();  // cpu/attention.cc

}  // namespace sieve::kernels
