#include "kv/sparse_sequence.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>
#include <unordered_map>
#include <unordered_set>

#include "util/numeric.h"

namespace sieve::kv {

namespace {

[[maybe_unused]] bool strictly_ascending(std::span<const int32_t> indices, int32_t limit) {
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= limit) return false;
    if (i > 0 && indices[i] <= indices[i - 1]) return false;
  }
  return true;
}

void sort_in_page_order(const SliceShape& shape, std::vector<SliceId>& slices) {
  std::sort(slices.begin(), slices.end(),
            [&](SliceId a, SliceId b) { return shape.page_order(a) < shape.page_order(b); });
}

}  // namespace

SparseSequence::SparseSequence(const SliceShape& shape, const PreciseAreas& precise) {
  assert(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.page_size > 0 &&
         "sparse sequences need KvConfig::num_layers and num_kv_heads");
  layout_.shape = shape;
  layout_.streams.resize(static_cast<size_t>(shape.num_streams()));
  for (int32_t stream : precise.streams())
    layout_.streams[static_cast<size_t>(stream)].f16_copy = true;
}

SparseSequence SparseSequence::adopt_dense(const SliceShape& shape, const PreciseAreas& precise,
                                           std::span<const PageId> block_table,
                                           int32_t num_tokens) {
  SparseSequence seq(shape, precise);
  const int64_t num_blocks = ceil_div(num_tokens, shape.page_size);
  assert(num_tokens >= 0 && num_blocks <= static_cast<int64_t>(block_table.size()));
  seq.pages_.assign(block_table.begin(), block_table.end());
  seq.layout_.num_positions = num_tokens;
  for (int32_t s = 0; s < shape.num_streams(); ++s) {
    SparseStream& stream = seq.layout_.streams[static_cast<size_t>(s)];
    stream.num_tokens = num_tokens;
    const int32_t rank = precise.rank(s);
    for (int64_t b = 0; b < num_blocks; ++b) {
      const PageId page = block_table[static_cast<size_t>(b)];
      stream.slices.push_back(shape.dense_slice(page, s));
      // A dense page keeps stream precise[rank]'s f16 rows in its own area of that rank.
      if (rank >= 0) stream.areas.push_back(precise.page_area(rank, page));
    }
  }
  for (size_t b = static_cast<size_t>(num_blocks); b < block_table.size(); ++b) {
    for (int32_t s = 0; s < shape.slices_per_page(); ++s) {
      seq.free_slices_.push_back(shape.dense_slice(block_table[b], s));
    }
    seq.add_page_areas(block_table[b], precise);
  }
  sort_in_page_order(shape, seq.free_slices_);
  return seq;
}

std::optional<SparseSequence> SparseSequence::copy_from_dense(
    const SliceShape& shape, std::span<const PageId> block_table, int32_t num_tokens,
    const KeepSets& keep, PagePool& pool, PreciseAreas& precise, CompactionPlan& plan) {
  assert(keep.size() == static_cast<size_t>(shape.num_streams()));
  assert(num_tokens >= 0 &&
         ceil_div(num_tokens, shape.page_size) <= static_cast<int64_t>(block_table.size()));
  int64_t num_slices = 0;
  for (const auto& kept : keep) {
    assert(!kept || strictly_ascending(*kept, num_tokens));
    num_slices += ceil_div(kept ? static_cast<int64_t>(kept->size()) : num_tokens, shape.page_size);
  }
  const int64_t num_pages = ceil_div(num_slices, shape.slices_per_page());
  if (num_pages > pool.num_free_pages()) return std::nullopt;

  SparseSequence seq(shape, precise);
  std::vector<SliceId> fresh;
  for (int64_t i = 0; i < num_pages; ++i) {
    std::optional<PageId> page = pool.allocate();
    assert(page);
    seq.pages_.push_back(*page);
    plan.new_pages.push_back(*page);
    for (int32_t s = 0; s < shape.slices_per_page(); ++s) {
      fresh.push_back(shape.dense_slice(*page, s));
    }
    seq.add_page_areas(*page, precise);
  }
  sort_in_page_order(shape, fresh);
  size_t next_fresh = 0;
  seq.layout_.num_positions = num_tokens;
  const int32_t page_size = shape.page_size;
  for (int32_t s = 0; s < shape.num_streams(); ++s) {
    const auto& kept = keep[static_cast<size_t>(s)];
    const int32_t num_kept = kept ? static_cast<int32_t>(kept->size()) : num_tokens;
    SparseStream& stream = seq.layout_.streams[static_cast<size_t>(s)];
    stream.num_tokens = num_kept;
    stream.num_dropped = num_tokens - num_kept;
    for (int64_t i = 0; i < ceil_div(num_kept, page_size); ++i) {
      stream.slices.push_back(fresh[next_fresh++]);
      if (!stream.f16_copy) continue;
      if (std::optional<AreaId> area = seq.take_area(precise)) {
        stream.areas.push_back(*area);
      } else {
        seq.drop_copy(stream, precise);
      }
    }
    const int32_t rank = precise.rank(s);
    for (int32_t i = 0; i < num_kept; ++i) {
      const int32_t position = kept ? (*kept)[static_cast<size_t>(i)] : i;
      const PageId page = block_table[static_cast<size_t>(position / page_size)];
      plan.token_moves.push_back(
          TokenMove{.src = {.slice = shape.dense_slice(page, s), .slot = position % page_size},
                    .dst = {.slice = stream.slices[static_cast<size_t>(i / page_size)],
                            .slot = i % page_size}});
      if (!stream.f16_copy) continue;
      plan.area_row_moves.push_back(
          AreaRowMove{.src = {.area = precise.page_area(rank, page), .slot = position % page_size},
                      .dst = {.area = stream.areas[static_cast<size_t>(i / page_size)],
                              .slot = i % page_size}});
    }
  }
  seq.free_slices_.assign(fresh.begin() + static_cast<ptrdiff_t>(next_fresh), fresh.end());
  return seq;
}

SlotAddress SparseSequence::storage_address(const SparseStream& stream,
                                            int64_t storage_index) const {
  const int32_t page_size = layout_.shape.page_size;
  return SlotAddress{.slice = stream.slices[static_cast<size_t>(storage_index / page_size)],
                     .slot = static_cast<int32_t>(storage_index % page_size)};
}

void SparseSequence::move_key(const SparseStream& stream, int64_t src, int64_t dst,
                              CompactionPlan& plan) const {
  plan.token_moves.push_back(
      TokenMove{.src = storage_address(stream, src), .dst = storage_address(stream, dst)});
  if (!stream.f16_copy) return;
  const int32_t page_size = layout_.shape.page_size;
  const auto area_slot = [&](int64_t storage) {
    return AreaSlot{.area = stream.areas[static_cast<size_t>(storage / page_size)],
                    .slot = static_cast<int32_t>(storage % page_size)};
  };
  plan.area_row_moves.push_back(AreaRowMove{.src = area_slot(src), .dst = area_slot(dst)});
}

std::optional<AreaId> SparseSequence::take_area(PreciseAreas& precise) {
  if (!free_areas_.empty()) {
    const AreaId area = free_areas_.front();
    free_areas_.erase(free_areas_.begin());
    return area;
  }
  return precise.take_spare();
}

void SparseSequence::give_back_area(AreaId area, PreciseAreas& precise) {
  if (precise.is_spare(area)) {
    precise.give_back_spare(area);
    return;
  }
  free_areas_.insert(std::lower_bound(free_areas_.begin(), free_areas_.end(), area), area);
}

void SparseSequence::add_page_areas(PageId page, const PreciseAreas& precise) {
  for (int32_t rank = 0; rank < precise.num_precise(); ++rank) {
    const AreaId area = precise.page_area(rank, page);
    free_areas_.insert(std::lower_bound(free_areas_.begin(), free_areas_.end(), area), area);
  }
}

void SparseSequence::drop_copy(SparseStream& stream, PreciseAreas& precise,
                               const std::unordered_set<int32_t>& leaving) {
  for (AreaId area : stream.areas) {
    if (precise.is_spare(area) || !leaving.contains(precise.page_of(area).value))
      give_back_area(area, precise);
  }
  stream.areas.clear();
  stream.f16_copy = false;
  precise.count_dropped_copy();
}

void SparseSequence::vacate_areas(const std::unordered_set<int32_t>& leaving, PreciseAreas& precise,
                                  CompactionPlan& plan) {
  if (precise.num_precise() == 0) return;
  const auto on_leaving = [&](AreaId area) {
    return !precise.is_spare(area) && leaving.contains(precise.page_of(area).value);
  };
  std::erase_if(free_areas_, on_leaving);
  for (SparseStream& stream : layout_.streams) {
    if (!stream.f16_copy) continue;
    for (AreaId& area : stream.areas) {
      if (!on_leaving(area)) continue;
      std::optional<AreaId> to = take_area(precise);
      if (!to) {
        // The copy goes: none of its areas needs a move, now or from an earlier release.
        std::erase_if(plan.area_moves, [&](const AreaMove& move) {
          return std::find(stream.areas.begin(), stream.areas.end(), move.dst) !=
                 stream.areas.end();
        });
        drop_copy(stream, precise, leaving);
        break;
      }
      // An area an earlier release of this plan moved here moves on from its first source, so
      // that no move reads another's destination.
      auto earlier = std::find_if(plan.area_moves.begin(), plan.area_moves.end(),
                                  [&](const AreaMove& move) { return move.dst == area; });
      if (earlier != plan.area_moves.end()) {
        earlier->dst = *to;
      } else {
        plan.area_moves.push_back(AreaMove{.src = area, .dst = *to});
      }
      area = *to;
    }
  }
}

SliceId SparseSequence::take_free_slice() {
  assert(!free_slices_.empty());
  SliceId slice = free_slices_.front();
  free_slices_.erase(free_slices_.begin());
  return slice;
}

void SparseSequence::give_back_slice(SliceId slice) {
  const SliceShape& shape = layout_.shape;
  free_slices_.insert(std::lower_bound(free_slices_.begin(), free_slices_.end(), slice,
                                       [&](SliceId a, SliceId b) {
                                         return shape.page_order(a) < shape.page_order(b);
                                       }),
                      slice);
}

void SparseSequence::trim_stream(SparseStream& stream, PreciseAreas& precise) {
  const int32_t page_size = layout_.shape.page_size;
  const size_t num_leading = stream.num_tokens == 0
                                 ? stream.slices.size()
                                 : static_cast<size_t>(stream.first_slot / page_size);
  for (size_t i = 0; i < num_leading; ++i) {
    give_back_slice(stream.slices[i]);
    if (stream.f16_copy) give_back_area(stream.areas[i], precise);
  }
  const auto leading = static_cast<ptrdiff_t>(num_leading);
  stream.slices.erase(stream.slices.begin(), stream.slices.begin() + leading);
  if (stream.f16_copy) stream.areas.erase(stream.areas.begin(), stream.areas.begin() + leading);
  stream.first_slot = stream.num_tokens == 0 ? 0 : stream.first_slot % page_size;
  const size_t num_needed =
      static_cast<size_t>(ceil_div(int64_t{stream.first_slot} + stream.num_tokens, page_size));
  while (stream.slices.size() > num_needed) {
    give_back_slice(stream.slices.back());
    stream.slices.pop_back();
    if (!stream.f16_copy) continue;
    give_back_area(stream.areas.back(), precise);
    stream.areas.pop_back();
  }
}

void SparseSequence::compact(const KeepSets& keep, PagePool& pool, PreciseAreas& precise,
                             CompactionPlan& plan) {
  assert(keep.size() == layout_.streams.size());
  for (size_t s = 0; s < keep.size(); ++s) {
    if (!keep[s]) continue;
    SparseStream& stream = layout_.streams[s];
    const std::vector<int32_t>& kept = *keep[s];
    assert(strictly_ascending(kept, stream.num_tokens));
    // Key i moves from storage first_slot + kept[i] to storage i, never after its source, so
    // front to back never overwrites a source still to be read.
    for (size_t i = 0; i < kept.size(); ++i) {
      const int64_t src = int64_t{stream.first_slot} + kept[i];
      const int64_t dst = static_cast<int64_t>(i);
      if (src == dst) continue;
      move_key(stream, src, dst, plan);
    }
    stream.num_dropped += stream.num_tokens - static_cast<int32_t>(kept.size());
    stream.num_tokens = static_cast<int32_t>(kept.size());
    stream.first_slot = 0;
    trim_stream(stream, precise);
  }
  pack(pool, precise, plan);
}

int32_t SparseSequence::num_pages_needed(int32_t num_tokens,
                                         std::span<const uint8_t> stores) const {
  assert(num_tokens >= 0);
  assert(stores.empty() || stores.size() == layout_.streams.size());
  const int32_t page_size = layout_.shape.page_size;
  int64_t num_slices = 0;
  for (size_t s = 0; s < layout_.streams.size(); ++s) {
    if (!stores.empty() && stores[s] == 0) continue;
    const SparseStream& stream = layout_.streams[s];
    num_slices += ceil_div(int64_t{stream.first_slot} + stream.num_tokens + num_tokens, page_size) -
                  static_cast<int64_t>(stream.slices.size());
  }
  const int64_t missing = num_slices - static_cast<int64_t>(free_slices_.size());
  return missing <= 0 ? 0
                      : static_cast<int32_t>(ceil_div(missing, layout_.shape.slices_per_page()));
}

std::optional<SparseAppend> SparseSequence::append(int32_t num_tokens,
                                                   std::span<const uint8_t> stores, PagePool& pool,
                                                   PreciseAreas& precise) {
  assert(num_tokens >= 1);
  assert(stores.empty() || stores.size() == layout_.streams.size());
  assert((num_tokens == 1 || std::find(stores.begin(), stores.end(), 0) == stores.end()) &&
         "only a single token may skip streams: a skipped token inside a chunk would break the "
         "causal mask rule");
  const int32_t num_new_pages = num_pages_needed(num_tokens, stores);
  if (num_new_pages > pool.num_free_pages()) return std::nullopt;

  const SliceShape& shape = layout_.shape;
  SparseAppend result;
  for (int32_t i = 0; i < num_new_pages; ++i) {
    std::optional<PageId> page = pool.allocate();
    assert(page);
    pages_.push_back(*page);
    result.new_pages.push_back(*page);
    for (int32_t s = 0; s < shape.slices_per_page(); ++s) {
      free_slices_.push_back(shape.dense_slice(*page, s));
    }
    add_page_areas(*page, precise);
  }
  sort_in_page_order(shape, free_slices_);
  result.first_index.resize(layout_.streams.size());
  result.first_slot.resize(layout_.streams.size());
  for (size_t s = 0; s < layout_.streams.size(); ++s) {
    SparseStream& stream = layout_.streams[s];
    if (!stores.empty() && stores[s] == 0) {
      stream.num_dropped += num_tokens;
      continue;
    }
    const int64_t first_storage = int64_t{stream.first_slot} + stream.num_tokens;
    const size_t num_needed =
        static_cast<size_t>(ceil_div(first_storage + num_tokens, shape.page_size));
    while (stream.slices.size() < num_needed) {
      stream.slices.push_back(take_free_slice());
      if (!stream.f16_copy) continue;
      if (std::optional<AreaId> area = take_area(precise)) {
        stream.areas.push_back(*area);
      } else {
        drop_copy(stream, precise);
      }
    }
    result.first_index[s] = stream.num_tokens;
    result.first_slot[s] = storage_address(stream, first_storage);
    stream.num_tokens += num_tokens;
  }
  layout_.num_positions += num_tokens;
  return result;
}

void SparseSequence::drop(const DropSets& drop, PagePool& pool, PreciseAreas& precise,
                          CompactionPlan& plan) {
  assert(drop.size() == layout_.streams.size());
  for (size_t s = 0; s < drop.size(); ++s) {
    const std::vector<int32_t>& dropped = drop[s];
    if (dropped.empty()) continue;
    SparseStream& stream = layout_.streams[s];
    assert(strictly_ascending(dropped, stream.num_tokens));
    const int32_t n = stream.num_tokens;
    const int32_t num_dropped = static_cast<int32_t>(dropped.size());
    // Kept keys after the first dropped one (shift towards the front) or before the last one
    // (shift towards the back, the stream then starts later in its first slice).
    const int32_t cost_front = (n - 1 - dropped.front()) - (num_dropped - 1);
    const int32_t cost_back = dropped.back() - (num_dropped - 1);
    if (cost_back < cost_front) {
      // Back to front: each destination is at or after its source, and every later source
      // lies before this one.
      int32_t shift = 0;
      size_t next = dropped.size();
      for (int32_t j = dropped.back(); j >= 0; --j) {
        if (next > 0 && dropped[next - 1] == j) {
          ++shift;
          --next;
          continue;
        }
        const int64_t src = int64_t{stream.first_slot} + j;
        move_key(stream, src, src + shift, plan);
      }
      stream.first_slot += num_dropped;
    } else {
      int32_t shift = 0;
      size_t next = 0;
      for (int32_t j = dropped.front(); j < n; ++j) {
        if (next < dropped.size() && dropped[next] == j) {
          ++shift;
          ++next;
          continue;
        }
        const int64_t src = int64_t{stream.first_slot} + j;
        move_key(stream, src, src - shift, plan);
      }
    }
    stream.num_tokens -= num_dropped;
    stream.num_dropped += num_dropped;
    trim_stream(stream, precise);
  }
  release_empty_pages(pool, precise, plan);
  if (num_free_slices() >= 2 * layout_.shape.slices_per_page() - 1) pack(pool, precise, plan);
}

void SparseSequence::release_pages(const std::unordered_set<int32_t>& leaving, PagePool& pool,
                                   PreciseAreas& precise, CompactionPlan& plan) {
  vacate_areas(leaving, precise, plan);
  std::vector<PageId> freed;
  for (int32_t page : leaving) freed.push_back(PageId{page});
  std::sort(freed.begin(), freed.end());
  for (PageId page : freed) {
    pool.release(page);
    plan.freed_pages.push_back(page);
  }
  std::erase_if(pages_, [&](PageId page) { return leaving.contains(page.value); });
}

void SparseSequence::release_empty_pages(PagePool& pool, PreciseAreas& precise,
                                         CompactionPlan& plan) {
  const int32_t slices_per_page = layout_.shape.slices_per_page();
  if (num_free_slices() < slices_per_page) return;
  // A page is empty when all of its slices are free (they are spread over the layers).
  std::unordered_map<int32_t, int32_t> free_in_page;
  for (SliceId slice : free_slices_) ++free_in_page[layout_.shape.page_of(slice).value];
  std::unordered_set<int32_t> empty;
  for (const auto& [page, num_free] : free_in_page) {
    if (num_free == slices_per_page) empty.insert(page);
  }
  if (empty.empty()) return;
  std::erase_if(free_slices_,
                [&](SliceId slice) { return empty.contains(layout_.shape.page_of(slice).value); });
  release_pages(empty, pool, precise, plan);
}

void SparseSequence::pack(PagePool& pool, PreciseAreas& precise, CompactionPlan& plan) {
  const SliceShape& shape = layout_.shape;
  const int64_t num_used = layout_.num_used_slices();
  const size_t num_target = static_cast<size_t>(ceil_div(num_used, shape.slices_per_page()));
  if (pages_.size() <= num_target) return;
  std::unordered_map<int32_t, int32_t> used_in_page;  // page -> used slices
  for (PageId page : pages_) used_in_page[page.value] = 0;
  for (const SparseStream& stream : layout_.streams) {
    for (SliceId slice : stream.slices) ++used_in_page[shape.page_of(slice).value];
  }
  // Keep the fullest pages (fewest slice moves); ties keep the lower page id.
  std::vector<PageId> by_use = pages_;
  std::sort(by_use.begin(), by_use.end(), [&](PageId a, PageId b) {
    const int32_t ua = used_in_page[a.value], ub = used_in_page[b.value];
    return ua != ub ? ua > ub : a < b;
  });
  std::unordered_set<int32_t> released;
  for (size_t i = num_target; i < by_use.size(); ++i) released.insert(by_use[i].value);

  std::vector<SliceId> destinations;  // free slices of kept pages, in page order
  for (SliceId slice : free_slices_) {
    if (!released.contains(shape.page_of(slice).value)) destinations.push_back(slice);
  }
  size_t next = 0;
  for (SparseStream& stream : layout_.streams) {
    for (SliceId& slice : stream.slices) {
      if (!released.contains(shape.page_of(slice).value)) continue;
      assert(next < destinations.size());
      plan.slice_moves.push_back(SliceMove{.src = slice, .dst = destinations[next]});
      slice = destinations[next++];
    }
  }
  free_slices_.assign(destinations.begin() + static_cast<ptrdiff_t>(next), destinations.end());
  release_pages(released, pool, precise, plan);
}

std::optional<SparseSequence> SparseSequence::copy_to_fresh_pages(PagePool& pool,
                                                                  PreciseAreas& precise,
                                                                  CompactionPlan& copies) const {
  const SliceShape& shape = layout_.shape;
  const int64_t num_pages = ceil_div(layout_.num_used_slices(), shape.slices_per_page());
  if (num_pages > pool.num_free_pages()) return std::nullopt;
  SparseSequence copy(shape, precise);
  copy.layout_ = layout_;
  std::vector<SliceId> fresh;
  for (int64_t i = 0; i < num_pages; ++i) {
    std::optional<PageId> page = pool.allocate();
    assert(page);
    copy.pages_.push_back(*page);
    for (int32_t s = 0; s < shape.slices_per_page(); ++s)
      fresh.push_back(shape.dense_slice(*page, s));
    copy.add_page_areas(*page, precise);
  }
  sort_in_page_order(shape, fresh);
  size_t next = 0;
  for (SparseStream& stream : copy.layout_.streams) {
    for (SliceId& slice : stream.slices) {
      copies.slice_moves.push_back(SliceMove{.src = slice, .dst = fresh[next]});
      slice = fresh[next++];
    }
    if (!stream.f16_copy) continue;
    const size_t first_move = copies.area_moves.size();
    for (size_t i = 0; i < stream.areas.size(); ++i) {
      std::optional<AreaId> area = copy.take_area(precise);
      if (!area) {
        copies.area_moves.resize(first_move);
        stream.areas.resize(i);  // the copy's own so far: drop_copy gives them back
        copy.drop_copy(stream, precise);
        break;
      }
      copies.area_moves.push_back(AreaMove{.src = stream.areas[i], .dst = *area});
      stream.areas[i] = *area;
    }
  }
  copy.free_slices_.assign(fresh.begin() + static_cast<ptrdiff_t>(next), fresh.end());
  return copy;
}

void SparseSequence::release(PagePool& pool, PreciseAreas& precise) {
  for (SparseStream& stream : layout_.streams) {
    for (AreaId area : stream.areas) {
      if (precise.is_spare(area)) precise.give_back_spare(area);
    }
  }
  for (auto page = pages_.rbegin(); page != pages_.rend(); ++page) pool.release(*page);
  pages_.clear();
  free_slices_.clear();
  free_areas_.clear();
  for (SparseStream& stream : layout_.streams) stream = SparseStream{};
  layout_.num_positions = 0;
}

std::optional<std::string> SparseSequence::invariant_violation(const PagePool& pool,
                                                               const PreciseAreas& precise,
                                                               std::vector<int32_t>& ref_uses,
                                                               std::vector<AreaId>& spares) const {
  const SliceShape& shape = layout_.shape;
  const int32_t page_size = shape.page_size;
  std::unordered_set<int32_t> owned;
  for (PageId page : pages_) {
    if (page.value < 0 || page.value >= pool.num_pages()) {
      return fmt::format("owns page {}, which does not exist", page.value);
    }
    if (!owned.insert(page.value).second) return fmt::format("owns page {} twice", page.value);
    if (pool.ref_count(page) != 1) {
      return fmt::format("owns page {} with ref count {}", page.value, pool.ref_count(page));
    }
    if (pool.block_hash(page)) return fmt::format("owns page {}, which is published", page.value);
    ++ref_uses[static_cast<size_t>(page.value)];
  }
  if (layout_.streams.size() != static_cast<size_t>(shape.num_streams())) {
    return fmt::format("has {} streams for {} (layer, KV head) pairs", layout_.streams.size(),
                       shape.num_streams());
  }
  std::unordered_set<int64_t> seen;
  auto claim = [&](SliceId slice) -> std::optional<std::string> {
    if (!owned.contains(shape.page_of(slice).value)) {
      return fmt::format("uses slice {} of page {}, which it does not own", slice.value,
                         shape.page_of(slice).value);
    }
    if (!seen.insert(slice.value).second) return fmt::format("uses slice {} twice", slice.value);
    return std::nullopt;
  };
  for (size_t s = 0; s < layout_.streams.size(); ++s) {
    const SparseStream& stream = layout_.streams[s];
    if (stream.num_tokens < 0 || stream.num_dropped < 0 ||
        stream.num_tokens + stream.num_dropped != layout_.num_positions) {
      return fmt::format("stream {}: {} tokens + {} dropped != {} positions", s, stream.num_tokens,
                         stream.num_dropped, layout_.num_positions);
    }
    if (stream.first_slot < 0 || stream.first_slot >= page_size ||
        (stream.num_tokens == 0 && stream.first_slot != 0)) {
      return fmt::format("stream {}: first slot {} with {} tokens", s, stream.first_slot,
                         stream.num_tokens);
    }
    const int64_t num_needed = ceil_div(int64_t{stream.first_slot} + stream.num_tokens, page_size);
    if (static_cast<int64_t>(stream.slices.size()) != num_needed) {
      return fmt::format("stream {}: {} slices for {} tokens from slot {}", s, stream.slices.size(),
                         stream.num_tokens, stream.first_slot);
    }
    for (SliceId slice : stream.slices) {
      if (auto violation = claim(slice)) return fmt::format("stream {} {}", s, *violation);
    }
  }
  for (size_t i = 0; i < free_slices_.size(); ++i) {
    if (i > 0 &&
        layout_.shape.page_order(free_slices_[i]) <= layout_.shape.page_order(free_slices_[i - 1]))
      return "free slices not in page order";
    if (auto violation = claim(free_slices_[i])) return fmt::format("free list {}", *violation);
  }
  if (static_cast<int64_t>(seen.size()) !=
      int64_t{shape.slices_per_page()} * static_cast<int64_t>(pages_.size())) {
    return fmt::format("{} slices used or free, but {} pages of {} slices owned", seen.size(),
                       pages_.size(), shape.slices_per_page());
  }
  if (num_free_slices() > 2 * shape.slices_per_page() - 2) {
    return fmt::format("{} free slices: should have been packed", num_free_slices());
  }
  return area_violation(precise, owned, spares);
}

std::optional<std::string> SparseSequence::area_violation(const PreciseAreas& precise,
                                                          const std::unordered_set<int32_t>& owned,
                                                          std::vector<AreaId>& spares) const {
  std::unordered_set<int32_t> seen;
  int64_t num_page_areas = 0;
  auto claim = [&](AreaId area) -> std::optional<std::string> {
    if (area.value < 0 || area.value >= precise.num_areas())
      return fmt::format("area {} does not exist", area.value);
    if (!seen.insert(area.value).second) return fmt::format("uses area {} twice", area.value);
    if (precise.is_spare(area)) {
      spares.push_back(area);
      return std::nullopt;
    }
    ++num_page_areas;
    if (!owned.contains(precise.page_of(area).value)) {
      return fmt::format("uses area {} of page {}, which it does not own", area.value,
                         precise.page_of(area).value);
    }
    return std::nullopt;
  };
  for (size_t s = 0; s < layout_.streams.size(); ++s) {
    const SparseStream& stream = layout_.streams[s];
    if (!stream.f16_copy) {
      if (!stream.areas.empty()) return fmt::format("stream {} has areas but no f16 copy", s);
      continue;
    }
    if (precise.rank(static_cast<int32_t>(s)) < 0)
      return fmt::format("stream {} is not precise but has an f16 copy", s);
    if (stream.areas.size() != stream.slices.size()) {
      return fmt::format("stream {}: {} areas for {} slices", s, stream.areas.size(),
                         stream.slices.size());
    }
    for (AreaId area : stream.areas) {
      if (auto violation = claim(area)) return fmt::format("stream {} {}", s, *violation);
    }
  }
  for (size_t i = 0; i < free_areas_.size(); ++i) {
    if (precise.is_spare(free_areas_[i])) return "keeps a spare area among its free ones";
    if (i > 0 && free_areas_[i] <= free_areas_[i - 1]) return "free areas not ascending";
    if (auto violation = claim(free_areas_[i])) return fmt::format("free areas {}", *violation);
  }
  if (num_page_areas != int64_t{precise.num_precise()} * std::ssize(pages_)) {
    return fmt::format("{} page areas used or free, but {} pages of {} owned", num_page_areas,
                       pages_.size(), precise.num_precise());
  }
  return std::nullopt;
}

}  // namespace sieve::kv
