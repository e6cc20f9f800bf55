#pragma once
// A fake model runner for sparse KV tests: one 64-bit tag per K/V row instead of head_dim floats,
// laid out like model::KvCache (rows v * page_size + slot of slice v, numbered as
// sparse_layout.h says), and one per row of the precise streams' f16 areas (precise_areas.h).
// It performs plans exactly as the contract in sparse_layout.h says, and refuses (test failure)
// to write a row of a page that is not private to the writer (ref count != 1 or published).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <ostream>
#include <set>
#include <utility>
#include <vector>

#include "kv/kv_manager.h"
#include "kv/sparse_layout.h"

namespace sieve::kv {

// The tests name slices in page order, as the pages fill: literal n is slice n % S of page
// n / S (S slices per page), whatever kv's numbering of it. Call Numbering::use(shape) first.
struct Numbering {
  static SliceShape& shape() {
    static SliceShape current;
    return current;
  }
  static void use(const SliceShape& shape) { Numbering::shape() = shape; }
};
// Slices print as the tests name them (page order), so failures read like the expectations.
inline void PrintTo(SliceId slice, std::ostream* os) {
  *os << "v" << Numbering::shape().page_order(slice);
}
inline void PrintTo(const SlotAddress& a, std::ostream* os) {
  PrintTo(a.slice, os);
  *os << ":" << a.slot;
}
inline void PrintTo(const TokenMove& m, std::ostream* os) {
  PrintTo(m.src, os);
  *os << "->";
  PrintTo(m.dst, os);
}
inline void PrintTo(const SliceMove& m, std::ostream* os) {
  PrintTo(m.src, os);
  *os << "->";
  PrintTo(m.dst, os);
}

namespace test {

inline SliceId V(int64_t n) {
  const SliceShape& shape = Numbering::shape();
  return shape.dense_slice(PageId{static_cast<int32_t>(n / shape.slices_per_page())},
                           static_cast<int32_t>(n % shape.slices_per_page()));
}
inline SlotAddress A(int64_t slice, int32_t slot) { return SlotAddress{V(slice), slot}; }
inline TokenMove M(int64_t src_slice, int32_t src_slot, int64_t dst_slice, int32_t dst_slot) {
  return TokenMove{A(src_slice, src_slot), A(dst_slice, dst_slot)};
}
inline std::vector<SliceId> Slices(std::initializer_list<int64_t> values) {
  std::vector<SliceId> slices;
  for (int64_t v : values) slices.push_back(V(v));
  return slices;
}

class FakeRunner {
 public:
  explicit FakeRunner(const KvManager& kv)
      : kv_(kv),
        shape_(kv.slice_shape()),
        precise_(kv.config().precise_streams, shape_.num_streams(), kv.num_pages(),
                 kv.config().num_spare_areas),
        rows_(static_cast<size_t>(kv.num_pages()) * shape_.slices_per_page() * shape_.page_size, 0),
        area_rows_(static_cast<size_t>(precise_.num_areas() * shape_.page_size), 0) {}

  uint64_t& area_row(AreaSlot a) {
    return area_rows_[static_cast<size_t>(a.area.value * shape_.page_size + a.slot)];
  }
  uint64_t area_row(AreaSlot a) const {
    return area_rows_[static_cast<size_t>(a.area.value * shape_.page_size + a.slot)];
  }
  // A dense write: stream s's row, and its page's area when s is precise.
  void write_dense(std::span<const PageId> table, int32_t stream, int32_t position, uint64_t tag) {
    write(dense_address(table, stream, position), tag);
    if (const std::optional<AreaSlot> area = dense_area(table, stream, position))
      area_row(*area) = tag;
  }
  std::optional<AreaSlot> dense_area(std::span<const PageId> table, int32_t stream,
                                     int32_t position) const {
    const int32_t rank = precise_.rank(stream);
    if (rank < 0) return std::nullopt;
    return AreaSlot{
        precise_.page_area(rank, table[static_cast<size_t>(position / shape_.page_size)]),
        position % shape_.page_size};
  }
  // A sparse write: key `index` of the stream, and its f16 copy if it has one.
  void write_sparse(const SparseLayout& layout, int32_t stream, int32_t index, uint64_t tag) {
    write(layout.address(stream, index), tag);
    if (layout.streams[static_cast<size_t>(stream)].f16_copy)
      area_row(layout.area_address(stream, index)) = tag;
  }

  uint64_t& row(SlotAddress a) {
    return rows_[static_cast<size_t>(a.slice.value * shape_.page_size + a.slot)];
  }
  uint64_t row(SlotAddress a) const {
    return rows_[static_cast<size_t>(a.slice.value * shape_.page_size + a.slot)];
  }
  // Refuses a write into a page that is shared, published or free.
  void write(SlotAddress a, uint64_t tag) {
    const PageId page = shape_.page_of(a.slice);
    if (std::find(returning_.begin(), returning_.end(), page) == returning_.end()) {
      check_private(page);
    }
    row(a) = tag;
  }
  void check_private(PageId page) const {
    EXPECT_EQ(kv_.pool().ref_count(page), 1) << "write into page " << page.value;
    EXPECT_FALSE(kv_.pool().block_hash(page)) << "write into published page " << page.value;
  }
  // Dense position of stream s: slice s of block_table[position / page_size].
  SlotAddress dense_address(std::span<const PageId> table, int32_t stream, int32_t position) const {
    return SlotAddress{
        shape_.dense_slice(table[static_cast<size_t>(position / shape_.page_size)], stream),
        position % shape_.page_size};
  }
  // Token moves may write into a page the plan returns (its slice moves then carry the rows
  // out); nothing else may. Checks the order contract: no token move reads a row an earlier one
  // wrote, and no slice move reads or writes a slice another one writes.
  void run(const CompactionPlan& plan) {
    returning_ = plan.freed_pages;
    std::set<std::pair<int64_t, int32_t>> written;
    for (const TokenMove& m : plan.token_moves) {
      EXPECT_FALSE(written.contains({m.src.slice.value, m.src.slot}))
          << "a token move reads a row an earlier move wrote";
      written.insert({m.dst.slice.value, m.dst.slot});
      write(m.dst, row(m.src));
    }
    returning_.clear();
    std::set<int64_t> slice_destinations;
    for (const SliceMove& m : plan.slice_moves) {
      EXPECT_TRUE(slice_destinations.insert(m.dst.value).second) << "two slice moves to one slice";
      EXPECT_EQ(std::count(plan.freed_pages.begin(), plan.freed_pages.end(), shape_.page_of(m.dst)),
                0);
      EXPECT_EQ(std::count(plan.freed_pages.begin(), plan.freed_pages.end(), shape_.page_of(m.src)),
                1);
    }
    for (const SliceMove& m : plan.slice_moves) {
      EXPECT_FALSE(slice_destinations.contains(m.src.value)) << "a slice move reads a destination";
    }
    run_slices(plan.slice_moves);
    std::set<std::pair<int32_t, int32_t>> area_written;
    for (const AreaRowMove& m : plan.area_row_moves) {
      EXPECT_FALSE(area_written.contains({m.src.area.value, m.src.slot}))
          << "an area row move reads a row an earlier move wrote";
      area_written.insert({m.dst.area.value, m.dst.slot});
      area_row(m.dst) = area_row(m.src);
    }
    std::set<int32_t> area_destinations;
    for (const AreaMove& m : plan.area_moves) {
      EXPECT_TRUE(area_destinations.insert(m.dst.value).second) << "two area moves to one area";
      EXPECT_FALSE(precise_.is_spare(m.src)) << "a spare area never moves";
      EXPECT_EQ(
          std::count(plan.freed_pages.begin(), plan.freed_pages.end(), precise_.page_of(m.src)), 1)
          << "an area move from a page the sequence keeps";
    }
    for (const AreaMove& m : plan.area_moves) {
      EXPECT_FALSE(area_destinations.contains(m.src.value)) << "an area move reads a destination";
    }
    run_areas(plan.area_moves);
  }
  // A fork's copies: slices and areas.
  void run_copies(const CompactionPlan& copies) {
    EXPECT_TRUE(copies.token_moves.empty() && copies.area_row_moves.empty());
    run_slices(copies.slice_moves);
    run_areas(copies.area_moves);
  }
  void run_areas(const std::vector<AreaMove>& moves) {
    for (const AreaMove& m : moves) {
      for (int32_t slot = 0; slot < shape_.page_size; ++slot)
        area_row(AreaSlot{m.dst, slot}) = area_row(AreaSlot{m.src, slot});
    }
  }
  void run_slices(const std::vector<SliceMove>& moves) {
    for (const SliceMove& m : moves) {
      for (int32_t slot = 0; slot < shape_.page_size; ++slot) {
        write(SlotAddress{m.dst, slot}, row(SlotAddress{m.src, slot}));
      }
    }
  }
  void copy_page(PageId src, PageId dst) {
    for (int32_t s = 0; s < shape_.slices_per_page(); ++s) {
      run_slices({SliceMove{shape_.dense_slice(src, s), shape_.dense_slice(dst, s)}});
    }
    for (int32_t rank = 0; rank < precise_.num_precise(); ++rank)
      run_areas({AreaMove{precise_.page_area(rank, src), precise_.page_area(rank, dst)}});
  }
  // The tags of stream s's keys, in order.
  std::vector<uint64_t> read_stream(const SparseLayout& layout, int32_t stream) const {
    std::vector<uint64_t> tags;
    for (int32_t j = 0; j < layout.streams[static_cast<size_t>(stream)].num_tokens; ++j) {
      tags.push_back(row(layout.address(stream, j)));
    }
    return tags;
  }
  // The same from its f16 copy.
  std::vector<uint64_t> read_copy(const SparseLayout& layout, int32_t stream) const {
    std::vector<uint64_t> tags;
    for (int32_t j = 0; j < layout.streams[static_cast<size_t>(stream)].num_tokens; ++j) {
      tags.push_back(area_row(layout.area_address(stream, j)));
    }
    return tags;
  }

 private:
  const KvManager& kv_;
  SliceShape shape_;
  PreciseAreas precise_;  // numbering only
  std::vector<uint64_t> rows_;
  std::vector<uint64_t> area_rows_;
  std::vector<PageId> returning_;
};

}  // namespace test
}  // namespace sieve::kv
