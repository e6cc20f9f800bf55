#pragma once
// Printers and helpers shared by the KV tests.
#include <cstdint>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "kv/kv_manager.h"

namespace sieve::kv {

inline void PrintTo(PageId page, std::ostream* os) { *os << "p" << page.value; }
inline void PrintTo(const PageCopy& copy, std::ostream* os) {
  *os << "PageCopy{p" << copy.src.value << " -> p" << copy.dst.value << ", block " << copy.block_idx
      << "}";
}
inline void PrintTo(const WriteInPlace&, std::ostream* os) { *os << "WriteInPlace"; }
inline void PrintTo(const NoFreePage&, std::ostream* os) { *os << "NoFreePage"; }
inline void PrintTo(const Allocation& a, std::ostream* os) {
  *os << "Allocation{first_new_block_idx " << a.first_new_block_idx << ", num_new_pages "
      << a.num_new_pages << "}";
}
inline void PrintTo(const BlockHash& h, std::ostream* os) {
  *os << std::hex << h.hi << ":" << h.lo << std::dec;
}

namespace test {

inline PageId P(int32_t value) { return PageId{value}; }
inline std::vector<PageId> Pages(std::initializer_list<int32_t> values) {
  std::vector<PageId> pages;
  for (int32_t v : values) pages.push_back(PageId{v});
  return pages;
}
// first, first + 1, ..., first + n - 1
inline std::vector<int32_t> Iota(int32_t first, int32_t n) {
  std::vector<int32_t> tokens(n);
  for (int32_t i = 0; i < n; ++i) tokens[i] = first + i;
  return tokens;
}
inline std::vector<PageId> Table(const KvManager& kv, SeqId seq) {
  auto table = kv.block_table(seq);
  return {table.begin(), table.end()};
}

// Everything observable about a manager, to check that a failed call changed nothing.
struct Snapshot {
  std::vector<PageId> free_queue;
  std::vector<int32_t> ref_counts;
  std::vector<std::optional<BlockHash>> hashes;
  std::vector<std::vector<PageId>> tables;
  KvStats stats;
  bool operator==(const Snapshot&) const = default;
};
inline Snapshot Snap(const KvManager& kv, const std::vector<SeqId>& seqs) {
  Snapshot s{.free_queue = kv.pool().free_queue(), .stats = kv.stats()};
  for (int32_t p = 0; p < kv.num_pages(); ++p) {
    s.ref_counts.push_back(kv.pool().ref_count(PageId{p}));
    s.hashes.push_back(kv.pool().block_hash(PageId{p}));
  }
  for (SeqId seq : seqs) s.tables.push_back(Table(kv, seq));
  return s;
}

}  // namespace test
}  // namespace sieve::kv
