#pragma once
// Strong ids for the KV layer. A PageId names one page of the pool (an index into the model
// runner's K/V storage); a SeqId names one sequence (one sample of one request). Neither has a
// "none" value: absence is std::optional.
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

}  // namespace sieve::kv

template <>
struct std::hash<sieve::kv::PageId> {
  size_t operator()(sieve::kv::PageId id) const noexcept { return std::hash<int32_t>{}(id.value); }
};

template <>
struct std::hash<sieve::kv::SeqId> {
  size_t operator()(sieve::kv::SeqId id) const noexcept { return std::hash<uint64_t>{}(id.value); }
};
