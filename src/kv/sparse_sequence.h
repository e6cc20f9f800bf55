#pragma once
// SparseSequence: the state of one sparse sequence inside KvManager (use KvManager's API; this
// header is the kv layer's own). It owns whole pages of the shared PagePool and places each
// stream's slices in them (see sparse_layout.h).
//
//   owned pages  p4            p9                  S = 4 slices per page (L=2, H=2), 16 pages
//   page slice   0  1  2  3    0  1  2  3          (slice s of page p: SliceShape::dense_slice)
//   used by      s0 s0 s1 s3   s2 .  .  .          free slices: p9's 1, 2, 3 (page order)
//
// Free slices are handed out in page order (SliceShape::page_order), so the pages fill one
// after the other. Pages are packed (used slices moved so that the
// sequence owns ceil(used / S) pages) after every compact(), and after drop() when 2S - 1 or
// more slices are free; a page all of whose slices are free is returned at once. So a sequence
// owns at most ceil(used / S) + 1 pages, and packing costs at most one slice move per slice
// freed since the last pack (amortised O(1) per dropped token).
//
// Precise streams (precise_areas.h) keep an f16 area per slice: the sequence hands out its own
// pages' areas (any rank's) first, then spares; a page that goes back to the pool first moves
// the areas in use on it elsewhere (CompactionPlan::area_moves), and a stream that finds no
// area drops its copy.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "kv/page_pool.h"
#include "kv/precise_areas.h"
#include "kv/sparse_layout.h"

namespace sieve::kv {

class SparseSequence {
 public:
  // No tokens, no pages; precise streams start with an (empty) f16 copy.
  SparseSequence(const SliceShape& shape, const PreciseAreas& precise);
  // Takes over a dense sequence's private pages in place (each ref 1 and unpublished, owned by
  // the caller until now): stream s holds positions [0, num_tokens) in slice s of block_table[b]
  // for b < ceil(num_tokens / page_size), a precise one its f16 copy in those pages' areas;
  // every other slice and area is free.
  static SparseSequence adopt_dense(const SliceShape& shape, const PreciseAreas& precise,
                                    std::span<const PageId> block_table, int32_t num_tokens);
  // Copies the kept tokens of a dense sequence (whose pages may be shared or published: they
  // are only read) into fresh pages, packed. keep[s] indexes positions < num_tokens (nullopt:
  // all). nullopt, with the pool and the spares unchanged, if it lacks the pages. The caller
  // releases the dense pages afterwards.
  static std::optional<SparseSequence> copy_from_dense(const SliceShape& shape,
                                                       std::span<const PageId> block_table,
                                                       int32_t num_tokens, const KeepSets& keep,
                                                       PagePool& pool, PreciseAreas& precise,
                                                       CompactionPlan& plan);

  const SparseLayout& layout() const { return layout_; }
  std::span<const PageId> pages() const { return pages_; }
  int32_t num_free_slices() const { return static_cast<int32_t>(free_slices_.size()); }

  // Keeps keep[s] of each stream, compacted to the front of the stream's slices, then packs
  // the pages. Appends the moves and freed pages to `plan`.
  void compact(const KeepSets& keep, PagePool& pool, PreciseAreas& precise, CompactionPlan& plan);
  // Pool pages append(num_tokens, stores) would take.
  int32_t num_pages_needed(int32_t num_tokens, std::span<const uint8_t> stores) const;
  // Appends num_tokens positions; streams with stores[s] == 0 skip them (only for one token).
  // Empty `stores`: every stream stores. nullopt, nothing changed, if the pool lacks pages.
  std::optional<SparseAppend> append(int32_t num_tokens, std::span<const uint8_t> stores,
                                     PagePool& pool, PreciseAreas& precise);
  // Drops drop[s] from each stream, shifting whichever side of the dropped keys is smaller.
  void drop(const DropSets& drop, PagePool& pool, PreciseAreas& precise, CompactionPlan& plan);
  // Fresh pages holding a copy of every used slice and area (for fork): copies into `copies`'
  // slice_moves and area_moves.
  std::optional<SparseSequence> copy_to_fresh_pages(PagePool& pool, PreciseAreas& precise,
                                                    CompactionPlan& copies) const;
  // Releases every page to the pool and every spare area.
  void release(PagePool& pool, PreciseAreas& precise);

  // Layout, slice, area and page bookkeeping; counts pages into ref_uses[page] and appends the
  // spare areas it holds to `spares`.
  std::optional<std::string> invariant_violation(const PagePool& pool, const PreciseAreas& precise,
                                                 std::vector<int32_t>& ref_uses,
                                                 std::vector<AreaId>& spares) const;

 private:
  std::optional<std::string> area_violation(const PreciseAreas& precise,
                                            const std::unordered_set<int32_t>& owned,
                                            std::vector<AreaId>& spares) const;
  SlotAddress storage_address(const SparseStream& stream, int64_t storage_index) const;
  // Moves the key at storage index src to dst, and its f16 copy.
  void move_key(const SparseStream& stream, int64_t src, int64_t dst, CompactionPlan& plan) const;
  SliceId take_free_slice();
  void give_back_slice(SliceId slice);
  // Areas: the sequence's own pages' free areas first, then a spare.
  std::optional<AreaId> take_area(PreciseAreas& precise);
  void give_back_area(AreaId area, PreciseAreas& precise);
  void add_page_areas(PageId page, const PreciseAreas& precise);
  // Gives the stream's areas back (but those on `leaving` pages) and counts the dropped copy.
  void drop_copy(SparseStream& stream, PreciseAreas& precise,
                 const std::unordered_set<int32_t>& leaving = {});
  // Areas in use on pages about to go back to the pool move to other areas.
  void vacate_areas(const std::unordered_set<int32_t>& leaving, PreciseAreas& precise,
                    CompactionPlan& plan);
  // Trailing / leading slices no key uses go back to the free list, with their areas.
  void trim_stream(SparseStream& stream, PreciseAreas& precise);
  void release_pages(const std::unordered_set<int32_t>& leaving, PagePool& pool,
                     PreciseAreas& precise, CompactionPlan& plan);
  void release_empty_pages(PagePool& pool, PreciseAreas& precise, CompactionPlan& plan);
  void pack(PagePool& pool, PreciseAreas& precise, CompactionPlan& plan);

  SparseLayout layout_;
  std::vector<PageId> pages_;         // owned, in the order taken
  std::vector<SliceId> free_slices_;  // owned and unused, in page order (SliceShape::page_order)
  std::vector<AreaId> free_areas_;    // owned pages' unused areas, ascending (never spares)
};

}  // namespace sieve::kv
