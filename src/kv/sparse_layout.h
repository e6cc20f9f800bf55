#pragma once
// Sparse KV layout: where the kept tokens of a compressed sequence live, per (layer, KV head).
// Integers only; the model runner owns the K/V values and performs the moves planned here.
//
// The pool is one flat array of equal *slices*: a slice is page_size K rows (and the same V rows)
// of one (layer, page, kv head). This file owns their numbering, layer-major like the storage
// (model::KvCache stores slice v at rows [v * page_size, (v + 1) * page_size) of its K and V):
//
//   SliceId v = (layer * num_pages + page) * num_kv_heads + kv_head    rows k[v * page_size + slot]
//
// so a page is S = num_layers * num_kv_heads slices (one per stream, spread over the layers), an
// attention kernel reads a stream through a table of slice ids where a dense head reads a block
// table of pages, and one layer's pages stay contiguous in memory.
//
// A dense sequence uses slice (layer, kv_head) of each page of its block table for that head.
// A sparse sequence instead has one *stream* per (layer, KV head): the head's kept tokens, in
// position order, in an ordered list of slices that may be *any* slice of any page the sequence
// owns (a slice is only rows of head_dim floats; K is stored after RoPE, so a kept token needs
// its order, not its position):
//
//   stream (l=1, h=0)   slices [ v=9 | v=4 | v=14 ]   first_slot 2, num_tokens 7, page_size 4
//                        . . k0 k1  k2 k3 k4 k5  k6 . . .      (. = unused slot)
//   key j lives at storage index first_slot + j: slice slices[(first_slot + j) / page_size],
//   slot (first_slot + j) % page_size.
//
// Pages of a sparse sequence are its own (ref count 1, never published to the prefix cache). A
// stream never holds an empty slice: slices.size() == ceil((first_slot + num_tokens) / page_size)
// and first_slot < page_size (0 when the stream is empty).
//
// Causal masking: every token a stream dropped precedes the tokens being computed, so key j of a
// stream is visible to a query at true position p iff j <= p - num_dropped, with num_dropped
// read after this step's append (a decode query sees every key).
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/ids.h"

namespace sieve::kv {

struct SliceShape {
  int32_t num_layers = 0;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;  // slots per slice = tokens per page
  int32_t num_pages = 0;  // of the pool: the numbering's layer stride
  int32_t slices_per_page() const { return num_layers * num_kv_heads; }
  int32_t num_streams() const { return num_layers * num_kv_heads; }
  int32_t stream_index(int32_t layer, int32_t kv_head) const {
    return layer * num_kv_heads + kv_head;
  }
  // The slice of stream `stream` (= layer * num_kv_heads + kv_head) in page `page`: the slice a
  // dense sequence reads for that stream; also the page's slices, for s < slices_per_page().
  SliceId dense_slice(PageId page, int32_t stream) const {
    const int64_t layer = stream / num_kv_heads, kv_head = stream % num_kv_heads;
    return SliceId{(layer * num_pages + page.value) * num_kv_heads + kv_head};
  }
  PageId page_of(SliceId slice) const {
    return PageId{static_cast<int32_t>((slice.value / num_kv_heads) % num_pages)};
  }
  int32_t stream_of(SliceId slice) const {
    return static_cast<int32_t>(slice.value / num_kv_heads / num_pages * num_kv_heads +
                                slice.value % num_kv_heads);
  }
  // Page order: by page, then by stream. A sequence hands out its free slices in this order,
  // so it fills one page before it starts the next.
  int64_t page_order(SliceId slice) const {
    return int64_t{page_of(slice).value} * slices_per_page() + stream_of(slice);
  }
  bool operator==(const SliceShape&) const = default;
};

// One K/V row: slot `slot` of slice `slice` (storage rows slice * page_size + slot).
struct SlotAddress {
  SliceId slice;
  int32_t slot = 0;
  bool operator==(const SlotAddress&) const = default;
};
// One row of the f16 copy: slot `slot` of area `area`.
struct AreaSlot {
  AreaId area;
  int32_t slot = 0;
  bool operator==(const AreaSlot&) const = default;
};

struct SparseStream {
  std::vector<SliceId> slices;  // storage order
  int32_t first_slot = 0;       // storage index of key 0, in [0, page_size)
  int32_t num_tokens = 0;       // keys held, in position order
  int32_t num_dropped = 0;      // positions of the sequence this stream does not hold
  // A precise stream's f16 copy (precise_areas.h): areas[i] holds the same slots as slices[i].
  // Empty, with f16_copy false, for every other stream and for one that dropped its copy.
  bool f16_copy = false;
  std::vector<AreaId> areas;
  bool operator==(const SparseStream&) const = default;
};

struct SparseLayout {
  SliceShape shape;
  int32_t num_positions = 0;          // tokens the sequence has (kept or dropped), every stream
  std::vector<SparseStream> streams;  // [layer * num_kv_heads + kv_head]

  const SparseStream& stream(int32_t layer, int32_t kv_head) const {
    return streams[static_cast<size_t>(shape.stream_index(layer, kv_head))];
  }
  // Where key `index` (< num_tokens) of stream `stream` lives.
  SlotAddress address(int32_t stream, int32_t index) const;
  // Where the f16 copy of that key lives (the stream has one: f16_copy).
  AreaSlot area_address(int32_t stream, int32_t index) const;
  // Slices all streams hold.
  int64_t num_used_slices() const;
  bool operator==(const SparseLayout&) const = default;
};

// Copy one K/V row (K and V) from src to dst.
struct TokenMove {
  SlotAddress src;
  SlotAddress dst;
  bool operator==(const TokenMove&) const = default;
};
// Copy a whole slice (page_size rows of K and of V) from src to dst.
struct SliceMove {
  SliceId src;
  SliceId dst;
  bool operator==(const SliceMove&) const = default;
};
// The same for the f16 copy of precise streams: one row, or a whole area.
struct AreaRowMove {
  AreaSlot src;
  AreaSlot dst;
  bool operator==(const AreaRowMove&) const = default;
};
struct AreaMove {
  AreaId src;
  AreaId dst;
  bool operator==(const AreaMove&) const = default;
};

// What the model runner must do after a compress() or drop_tokens(), before any later K/V write
// or copy the manager directs (pages in freed_pages are back in the pool and may be handed to
// anyone, and slice moves read from them):
//   1. token_moves, in the order given. No move overwrites a row a later move reads, so no
//      scratch space is needed (within a stream, moves towards the front run front to back,
//      moves towards the back run back to front; when leaving shared pages every source is in
//      an old page and every destination in a new one). A destination may lie in a page of
//      freed_pages (step 2 carries that slice out), and so may a source.
//   2. slice_moves, in any order: sources and destinations are all distinct slices, every
//      source in a page of freed_pages, every destination in a page the sequence keeps.
//   3. area_row_moves, in the order given: token_moves' rows of streams with an f16 copy, in
//      their areas (the same order rule).
//   4. area_moves, in any order: distinct areas; every source a page area of a page in
//      freed_pages, every destination an area the sequence keeps.
// (A fork's copies use slice_moves and area_moves only, sources in the parent's pages.)
struct CompactionPlan {
  std::vector<TokenMove> token_moves;
  std::vector<SliceMove> slice_moves;
  std::vector<AreaRowMove> area_row_moves;
  std::vector<AreaMove> area_moves;
  std::vector<PageId> new_pages;    // taken from the pool by this call
  std::vector<PageId> freed_pages;  // returned to the pool by this call
  bool operator==(const CompactionPlan&) const = default;
};

// Per stream [layer * num_kv_heads + kv_head]: the stream's key indices (for a dense sequence:
// positions) to keep, strictly ascending; nullopt keeps the stream as it is. This is the order
// sparsity::select_* index into ("kept tokens so far, then the new chunk").
using KeepSets = std::vector<std::optional<std::vector<int32_t>>>;
// Per stream: key indices to drop, strictly ascending; empty drops nothing.
using DropSets = std::vector<std::vector<int32_t>>;

struct SparseAppend {
  std::vector<PageId> new_pages;  // taken from the pool by this call
  // [num_streams]: the key index of the first appended token (token i of the append is key
  // first_index + i; write it at layout.address(stream, first_index + i)); nullopt: the stream
  // did not store the tokens.
  std::vector<std::optional<int32_t>> first_index;
  // [num_streams]: where the first appended token goes (for a decode step: the new token).
  std::vector<std::optional<SlotAddress>> first_slot;
};

// Admission bound for a request that turns sparse. All counts are tokens.
struct SparsePeakQuery {
  SliceShape shape;
  // [num_streams]: the most tokens the stream keeps after each compression
  // (sparsity::max_kept_tokens of its head); nullopt: it keeps everything.
  std::span<const std::optional<int64_t>> max_kept_tokens;
  // Tokens appended between two compressions: the prefill chunk size (>= 1; decode appends 1).
  int64_t chunk_size = 1;
  // Prompt + max new tokens: no stream ever holds more.
  int64_t max_total_tokens = 0;
  // Tokens held densely when the sequence first compresses (a prefix-cache hit plus its first
  // chunk); 0 when it starts sparse (KvManager::start_sparse). Leaving dense pages needs old +
  // new pages for that one step.
  int64_t dense_tokens_at_first_compression = 0;
  // Those dense pages are the sequence's alone and unpublished (KvManager::compress turns them
  // sparse in place): no copy.
  bool in_place = false;
};
// The most pages the sequence can own at any time, provided the caller compresses every
// bounded stream back to its bound at least every chunk_size appended tokens:
//   max(ceil(d / page_size) + copy_pages, sparse_pages)
//   copy_pages   = ceil(sum_s ceil(min(b_s, d) / page_size) / S)     leaving the dense pages
//                  (0 in_place)
//   sparse_pages = ceil(sum_s (ceil(t_s / page_size) + 1) / S) + 1
// with b_s the stream's bound (T when nullopt), t_s = min(b_s + chunk_size, T),
// T = max_total_tokens, d = dense_tokens_at_first_compression. The + 1 per stream: a stream that
// dropped from its front may start mid-slice; the + 1 page: drop_tokens() leaves up to 2S - 2
// free slices before it packs.
int64_t sparse_peak_pages(const SparsePeakQuery& query);

}  // namespace sieve::kv
