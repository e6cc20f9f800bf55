#pragma once
// A sequence's K/V in shuffled, non-contiguous pages of a larger pool, every float a kernel
// must not read set to NaN; shared by the paged attention and attention-score tests.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "kernels/paged_attention.h"

namespace sieve::kernels {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

struct CacheShape {
  int64_t num_keys = 0;  // positions [0, num_keys) hold K/V
  int64_t num_kv_heads = 2;
  int64_t head_dim = 64;
  int32_t page_size = 16;
  // kF16: the pool holds halves (the values are rounded to f16); kQ8_0 / kQ4_1: each row
  // quantized by quantize_row (head_dim a multiple of 32).
  DType dtype = DType::kF32;
};

// value(position, kv_head, dim) for K or V.
using KvFill = std::function<float(int64_t, int64_t, int64_t)>;

// One sequence's K/V in a pool of 2 * num_blocks + 3 pages. The block table has one entry
// more than the sequence needs (room to grow), pointing at a NaN page. Strides leave NaN gaps
// between heads (3 floats) and pages (5 floats); for the block dtypes 32 and 64 elements, and
// every byte outside the written rows is 0xFF (a NaN f16 scale: a stray read gives NaN).
class TestCache {
 public:
  TestCache(const CacheShape& shape, uint32_t seed, const KvFill& k_fill = {},
            const KvFill& v_fill = {})
      : shape_(shape) {
    const int64_t num_blocks = (shape.num_keys + shape.page_size - 1) / shape.page_size;
    const int64_t num_pages = 2 * num_blocks + 3;
    const bool blocks = is_block_kv_dtype(shape.dtype);
    head_stride_ = shape.page_size * shape.head_dim + (blocks ? 32 : 3);
    page_stride_ = shape.num_kv_heads * head_stride_ + (blocks ? 64 : 5);
    k_.assign(static_cast<size_t>(num_pages * page_stride_), kNaN);
    v_ = k_;
    std::vector<int32_t> pages(static_cast<size_t>(num_pages));
    std::iota(pages.begin(), pages.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(pages.begin(), pages.end(), rng);
    block_table_.assign(pages.begin(), pages.begin() + num_blocks + 1);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const PagedKv kv = view();
    for (int64_t t = 0; t < shape.num_keys; ++t) {
      for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
        const int64_t offset = kv_offset(kv, t, h);
        for (int64_t d = 0; d < shape.head_dim; ++d) {
          k_[offset + d] = k_fill ? k_fill(t, h, d) : dist(rng);
          v_[offset + d] = v_fill ? v_fill(t, h, d) : dist(rng);
        }
      }
    }
    if (shape.dtype == DType::kF16) {  // NaN stays NaN (0x7E00)
      for (float f : k_) k16_.push_back(f32_to_f16(f));
      for (float f : v_) v16_.push_back(f32_to_f16(f));
    }
    if (blocks) {
      kq_.assign(row_bytes(shape.dtype, static_cast<int64_t>(k_.size())), 0xFF);
      vq_ = kq_;
      for (int64_t t = 0; t < shape.num_keys; ++t) {
        for (int64_t h = 0; h < shape.num_kv_heads; ++h) {
          const int64_t offset = kv_offset(kv, t, h);
          const size_t at = row_bytes(shape.dtype, offset);
          quantize_row(shape.dtype, &k_[offset], kq_.data() + at, shape.head_dim);
          quantize_row(shape.dtype, &v_[offset], vq_.data() + at, shape.head_dim);
        }
      }
    }
  }

  PagedKv view() const {
    PagedKv kv = f32_view();
    if (shape_.dtype == DType::kF32) return kv;
    kv.k = kv.v = nullptr;
    kv.dtype = shape_.dtype;
    if (is_block_kv_dtype(shape_.dtype)) {
      kv.k_q = kq_.data();
      kv.v_q = vq_.data();
    } else {
      kv.k_f16 = k16_.data();
      kv.v_f16 = v16_.data();
    }
    return kv;
  }
  // The same keys and values in f32, before any rounding to the pool's dtype.
  PagedKv f32_view() const {
    return PagedKv{k_.data(),        v_.data(),       page_stride_,        head_stride_,
                   shape_.page_size, shape_.head_dim, shape_.num_kv_heads, block_table_};
  }
  const CacheShape& shape() const { return shape_; }
  // Elements of the whole K (or V) pool that view() points into, gaps included.
  size_t num_elements() const { return k_.size(); }
  // Bytes of the whole K (or V) pool that view() points into.
  size_t num_bytes() const { return row_bytes(shape_.dtype, static_cast<int64_t>(k_.size())); }

 private:
  CacheShape shape_;
  int64_t head_stride_ = 0, page_stride_ = 0;
  std::vector<float> k_, v_;
  std::vector<uint16_t> k16_, v16_;  // F16 pools only
  std::vector<uint8_t> kq_, vq_;     // Q8_0 / Q4_1 pools only
  std::vector<int32_t> block_table_;
};

inline std::vector<int32_t> position_range(int64_t begin, int64_t end) {
  std::vector<int32_t> positions(static_cast<size_t>(end - begin));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(begin));
  return positions;
}

}  // namespace sieve::kernels
