// plan_paged_attention(): row tiles x kv-head groups x key pieces (fixed for short jobs).
#include <algorithm>
#include <cassert>
#include <limits>

#include "kernels/cpu/attention.h"

namespace sieve::kernels {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

AttentionPlan plan_paged_attention(const PagedKv& kv, const AttentionQuery& q, int num_threads) {
  assert(kv.num_kv_heads > 0 && q.num_heads % kv.num_kv_heads == 0);
  assert(kv.page_size > 0 && kv.head_dim > 0);
  const int64_t group = q.num_heads / kv.num_kv_heads;
  const int64_t num_q = static_cast<int64_t>(q.positions.size());
  [[maybe_unused]] const int64_t capacity =
      static_cast<int64_t>(kv.block_table.size()) * kv.page_size - kv.key_offset;

  AttentionPlan plan;
  const bool row_invariant = num_q <= kAttentionInvariantRows && !q.chunk_tiles;
  const int64_t vectors_per_task =
      row_invariant ? kAttentionQueryVectorsPerTask : kAttentionLongJobQueryVectorsPerTask;
  plan.rows_per_tile = std::max<int64_t>(1, vectors_per_task / group);
  const int64_t rows_per_tile = std::min(plan.rows_per_tile, std::max<int64_t>(1, num_q));
  // kv heads per task: as many as the query-vector budget allows (decode), evened out.
  int64_t heads_per_task =
      std::clamp<int64_t>(vectors_per_task / (rows_per_tile * group), 1, kv.num_kv_heads);
  const int64_t num_head_groups = ceil_div(kv.num_kv_heads, heads_per_task);
  heads_per_task = ceil_div(kv.num_kv_heads, num_head_groups);
  plan.max_query_vectors = rows_per_tile * group * heads_per_task;

  struct RowTile {
    int64_t begin, end;
    int64_t first_key;  // page-aligned; > 0 only under a sliding window (older keys are not read)
    int64_t num_keys;
  };
  std::vector<RowTile> tiles;
  int64_t total_key_heads = 0;  // K (or V) rows read over all tasks, before splitting
  for (int64_t begin = 0; begin < num_q; begin += plan.rows_per_tile) {
    const int64_t end = std::min(num_q, begin + plan.rows_per_tile);
    int64_t num_keys = 0;
    int64_t first_key = std::numeric_limits<int64_t>::max();
    for (int64_t i = begin; i < end; ++i) {
      assert(q.positions[i] >= 0 && q.positions[i] < capacity);
      num_keys = std::max(num_keys, int64_t{q.positions[i]} + 1);
      first_key = std::min(first_key, first_visible_key(q, static_cast<size_t>(i)));
    }
    first_key = first_key / kv.page_size * kv.page_size;
    tiles.push_back({begin, end, first_key, num_keys});
    total_key_heads += (num_keys - first_key) * kv.num_kv_heads;
    plan.total_macs += 2 * (num_keys - first_key) * (end - begin) * q.num_heads * kv.head_dim;
  }

  plan.row_invariant = row_invariant;
  if (plan.row_invariant) {
    // Keys split at absolute multiples of split_keys (whole pages), whatever the rows, heads and
    // threads: a row's keys go through the same pieces, tiles and merge whether it is attended
    // alone (decode) or in a short chunk (a speculative verification), so both give the same
    // bits. A piece a row cannot see merges as nothing (max -inf).
    const int64_t split_keys = attention_split_keys(kv.page_size);
    // Too few pieces to keep kAttentionTasksPerThread tasks per thread busy (a decode row under
    // a few split_keys keys; its last piece is short): fewer kv heads per task, so that the
    // threads share the heads and even out. A head's arithmetic does not depend on which heads
    // share its task, so the bits stay the same.
    int64_t num_pieces_total = 0;
    for (const RowTile& tile : tiles)
      num_pieces_total += (tile.num_keys - 1) / split_keys - tile.first_key / split_keys + 1;
    const int64_t wanted_tasks = num_threads > 1 ? kAttentionTasksPerThread * num_threads : 1;
    if (num_pieces_total > 0 && num_pieces_total * num_head_groups < wanted_tasks &&
        heads_per_task > 1) {
      const int64_t wanted_groups =
          std::min(kv.num_kv_heads, ceil_div(wanted_tasks, num_pieces_total));
      heads_per_task = ceil_div(kv.num_kv_heads, wanted_groups);
    }
    for (const RowTile& tile : tiles) {
      const int64_t first_piece = tile.first_key / split_keys;
      const int64_t num_pieces = (tile.num_keys - 1) / split_keys - first_piece + 1;
      for (int64_t h0 = 0; h0 < kv.num_kv_heads; h0 += heads_per_task) {
        const int64_t h1 = std::min(kv.num_kv_heads, h0 + heads_per_task);
        if (num_pieces == 1) {
          plan.tasks.push_back(
              {tile.begin, tile.end, h0, h1, tile.first_key, tile.num_keys, std::nullopt});
          continue;
        }
        for (int64_t h = h0; h < h1; ++h) {
          plan.merges.push_back({tile.begin, tile.end, h, h - h0, plan.num_slots, num_pieces});
        }
        for (int64_t piece = first_piece; piece < first_piece + num_pieces; ++piece) {
          plan.tasks.push_back(
              {tile.begin, tile.end, h0, h1, std::max(tile.first_key, piece * split_keys),
               std::min(tile.num_keys, (piece + 1) * split_keys), plan.num_slots++});
        }
      }
    }
  } else {
    // Prefill chunks: split when the unsplit tasks cannot keep kAttentionTasksPerThread tasks
    // per thread busy: pieces of ~total / wanted K rows, but no fewer than
    // kAttentionMinTaskBytes of K+V.
    int64_t split_key_heads = std::numeric_limits<int64_t>::max();
    const int64_t wanted_tasks = kAttentionTasksPerThread * num_threads;
    if (num_threads > 1 && static_cast<int64_t>(tiles.size()) * num_head_groups < wanted_tasks) {
      // K+V bytes per key and head; quantized rows count as f16 ones (their dequantization
      // makes a key cost about as much as an f16 key, so the same key count pays for a task).
      const int64_t kv_row_bytes = 2 * kv.head_dim * (kv.dtype == DType::kF32 ? 4 : 2);
      split_key_heads = std::max(ceil_div(kAttentionMinTaskBytes, kv_row_bytes),
                                 ceil_div(total_key_heads, wanted_tasks));
    }
    for (const RowTile& tile : tiles) {
      for (int64_t h0 = 0; h0 < kv.num_kv_heads; h0 += heads_per_task) {
        const int64_t h1 = std::min(kv.num_kv_heads, h0 + heads_per_task);
        // Even, page-aligned pieces.
        const int64_t tile_keys = tile.num_keys - tile.first_key;
        int64_t num_splits = 1;
        int64_t chunk = tile_keys;
        if (tile_keys * (h1 - h0) > split_key_heads) {
          num_splits = ceil_div(tile_keys * (h1 - h0), split_key_heads);
          chunk = ceil_div(ceil_div(tile_keys, num_splits), kv.page_size) * kv.page_size;
          num_splits = ceil_div(tile_keys, chunk);
        }
        if (num_splits == 1) {
          plan.tasks.push_back(
              {tile.begin, tile.end, h0, h1, tile.first_key, tile.num_keys, std::nullopt});
          continue;
        }
        for (int64_t h = h0; h < h1; ++h) {
          plan.merges.push_back({tile.begin, tile.end, h, h - h0, plan.num_slots, num_splits});
        }
        for (int64_t sp = 0; sp < num_splits; ++sp) {
          plan.tasks.push_back({tile.begin, tile.end, h0, h1, tile.first_key + sp * chunk,
                                std::min(tile.num_keys, tile.first_key + (sp + 1) * chunk),
                                plan.num_slots++});
        }
      }
    }
  }
  const auto cost = [](const AttentionTask& t) {
    return (t.key_end - t.key_begin) * (t.row_end - t.row_begin) *
           (t.kv_head_end - t.kv_head_begin);
  };
  std::stable_sort(
      plan.tasks.begin(), plan.tasks.end(),
      [&](const AttentionTask& a, const AttentionTask& b) { return cost(a) > cost(b); });
  return plan;
}

}  // namespace sieve::kernels
