#include "kv/sparse_layout.h"

#include <algorithm>
#include <cassert>

#include "util/numeric.h"

namespace sieve::kv {

SlotAddress SparseLayout::address(int32_t stream, int32_t index) const {
  const SparseStream& s = streams[static_cast<size_t>(stream)];
  assert(index >= 0 && index < s.num_tokens);
  const int64_t storage = int64_t{s.first_slot} + index;
  return SlotAddress{.slice = s.slices[static_cast<size_t>(storage / shape.page_size)],
                     .slot = static_cast<int32_t>(storage % shape.page_size)};
}

AreaSlot SparseLayout::area_address(int32_t stream, int32_t index) const {
  const SparseStream& s = streams[static_cast<size_t>(stream)];
  assert(s.f16_copy && index >= 0 && index < s.num_tokens);
  const int64_t storage = int64_t{s.first_slot} + index;
  return AreaSlot{.area = s.areas[static_cast<size_t>(storage / shape.page_size)],
                  .slot = static_cast<int32_t>(storage % shape.page_size)};
}

int64_t SparseLayout::num_used_slices() const {
  int64_t total = 0;
  for (const SparseStream& s : streams) total += static_cast<int64_t>(s.slices.size());
  return total;
}

int64_t sparse_peak_pages(const SparsePeakQuery& query) {
  const SliceShape& shape = query.shape;
  assert(shape.num_layers > 0 && shape.num_kv_heads > 0 && shape.page_size > 0);
  assert(query.max_kept_tokens.size() == static_cast<size_t>(shape.num_streams()));
  assert(query.chunk_size >= 1 && query.max_total_tokens >= 0);
  const int64_t total = query.max_total_tokens;
  const int64_t dense = std::min(query.dense_tokens_at_first_compression, total);
  const int64_t page_size = shape.page_size;
  int64_t copy_slices = 0;
  int64_t sparse_slices = 0;
  for (const std::optional<int64_t>& bound : query.max_kept_tokens) {
    const int64_t kept = bound ? std::min(*bound, total) : total;
    copy_slices += ceil_div(std::min(kept, dense), page_size);
    const int64_t held = bound ? std::min(*bound + query.chunk_size, total) : total;
    sparse_slices += ceil_div(held, page_size) + 1;
  }
  const int64_t slices_per_page = shape.slices_per_page();
  const int64_t leave_dense =
      dense == 0 ? 0
                 : ceil_div(dense, page_size) +
                       (query.in_place ? 0 : ceil_div(copy_slices, slices_per_page));
  return std::max(leave_dense, ceil_div(sparse_slices, slices_per_page) + 1);
}

}  // namespace sieve::kv
