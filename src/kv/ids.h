#pragma once
// Strong ids for the KV layer. A PageId names one page of the pool (an index into the model
// runner's K/V storage); a SeqId names one sequence (one sample of one request). Neither has a
// "none" value: absence is std::optional. A SliceId names one (layer, KV head) slice of one page
// (see sparse_layout.h).
#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace sieve::kv {

struct PageId {
  int32_t value = 0;  // in [0, num_pages)
  auto operator<=>(const PageId&) const = default;
};

struct SeqId {
  uint64_t value = 0;
  auto operator<=>(const SeqId&) const = default;
};

// page * (num_layers * num_kv_heads) + layer * num_kv_heads + kv_head, in
// [0, num_pages * num_layers * num_kv_heads). int64: the product can pass 2^31.
struct SliceId {
  int64_t value = 0;
  auto operator<=>(const SliceId&) const = default;
};

// rank * num_pages + page for a page's own area, then the spare ones (precise_areas.h).
struct AreaId {
  int32_t value = 0;
  auto operator<=>(const AreaId&) const = default;
};

}  // namespace sieve::kv

template <>
struct std::hash<sieve::kv::PageId> {
  size_t operator()(sieve::kv::PageId id) const noexcept { return std::hash<int32_t>{}(id.value); }
};

template <>
struct std::hash<sieve::kv::SeqId> {
  size_t operator()(sieve::kv::SeqId id) const noexcept { return std::hash<uint64_t>{}(id.value); }
};
