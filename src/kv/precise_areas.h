#pragma once
// PreciseAreas: where the f16 copy of the precise streams lives (model::KvCache keeps the few
// (layer, KV head) streams that q8 / q4 round far worse than the others in f16 as well). The
// copy is one flat array of *areas*, each page_size rows of one stream, numbered
//
//   area rank * num_pages + page     page `page`'s own area for precise stream `rank`
//   area num_precise * num_pages + i spare area i, i < num_spare
//
// A dense sequence's stream precise[rank] keeps its f16 rows of page p in area (rank, p), so
// the copy follows the page through prefix sharing and copy-on-write. A sparse sequence places
// a stream's keys in any slice of its pages (sparse_layout.h), so each precise stream there
// keeps an area per slice (SparseStream::areas, same slots), taken from the page areas of the
// pages it owns first and from the spares after: a precise stream that keeps more keys than
// the average stream (lserve's dynamic heads, pyramidkv's lower layers) holds more slices than
// its sequence owns pages. When neither is left the stream drops its copy and reads the q8 /
// q4 rows, which are always written too: precision is best effort, never a reason to wait.
//
// Integers only, like the rest of the kv layer; the engine sizes the spares (and pays for them
// in --kv-memory) and the model runner stores and moves the rows.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kv/ids.h"

namespace sieve::kv {

class PreciseAreas {
 public:
  PreciseAreas() = default;  // no precise streams
  // streams: ascending stream indices (layer * num_kv_heads + kv head) of num_streams.
  PreciseAreas(std::vector<int32_t> streams, int32_t num_streams, int32_t num_pages,
               int32_t num_spare);

  std::span<const int32_t> streams() const { return streams_; }
  int32_t num_precise() const { return static_cast<int32_t>(streams_.size()); }
  // The stream's index among streams(), or -1.
  int32_t rank(int32_t stream) const {
    return rank_.empty() ? -1 : rank_[static_cast<size_t>(stream)];
  }
  int32_t num_pages() const { return num_pages_; }
  int32_t num_spare() const { return num_spare_; }
  int64_t num_areas() const { return int64_t{num_precise()} * num_pages_ + num_spare_; }

  // The numbering of a page's own areas (model::KvCache addresses its f16 rows by it).
  static AreaId page_area(int32_t rank, PageId page, int32_t num_pages) {
    return AreaId{rank * num_pages + page.value};
  }
  AreaId page_area(int32_t rank, PageId page) const { return page_area(rank, page, num_pages_); }
  bool is_spare(AreaId area) const { return area.value >= num_precise() * num_pages_; }
  // The page whose own area `area` is (not a spare).
  PageId page_of(AreaId area) const { return PageId{area.value % num_pages_}; }

  // Spares: nullopt when none is free.
  std::optional<AreaId> take_spare();
  void give_back_spare(AreaId area);
  int32_t num_free_spares() const { return static_cast<int32_t>(free_spares_.size()); }
  // Streams that dropped their copy for lack of an area, since the start.
  int64_t num_dropped_copies() const { return num_dropped_copies_; }
  void count_dropped_copy() { ++num_dropped_copies_; }

  // The free spares are distinct spares; `held` (spares in use, each once) and the free ones
  // are all of them.
  std::optional<std::string> invariant_violation(std::span<const AreaId> held) const;

 private:
  std::vector<int32_t> streams_;
  std::vector<int32_t> rank_;  // [stream], -1 where not precise; empty: none
  int32_t num_pages_ = 0;
  int32_t num_spare_ = 0;
  std::vector<AreaId> free_spares_;  // taken from the back
  int64_t num_dropped_copies_ = 0;
};

}  // namespace sieve::kv
