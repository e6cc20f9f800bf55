#pragma once
// The K/V values of the whole page pool, in f32 or f16 (kKvDefaultDType). Which pages a sequence
// uses is decided by kv::KvManager (integers only); this class only stores them. Layout (floats; V
// identical):
//
//   k[layer][page][kv_head][slot][head_dim]      slot in [0, page_size)
//
// so one page id covers page_size consecutive positions in every layer, for a fixed
// (layer, kv head) the slots of a page are contiguous rows for the attention kernel, and a
// layer's pages are contiguous: a sequence whose pages have consecutive ids is read by one
// layer's attention as one linear stream (with pages interleaved across layers, each page
// was a separate 8 KiB stream that the hardware prefetchers restart on: decode at 8k depth ran
// at ~1/3 of the plain read bandwidth).
//
// K and V live in the backend's memory (two DeviceBuffers); every write and copy here is a
// backend call (store_kv_rows, copy), so the host never touches them. The backend must outlive
// the cache.
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/paged_attention.h"
#include "kv/sparse_layout.h"
#include "model/config.h"

namespace sieve::model {

// The element type K and V are stored in unless a caller asks otherwise. kF16 halves the bytes
// every decode step reads per attended key (decode at long contexts is bound by them), but its
// rounding is not within the golden tests' logprob tolerance (1e-3; f16 K/V moved
// stories260K's top logprobs by up to 2e-3), so f32 stays the default.
inline constexpr kernels::DType kKvDefaultDType = kernels::DType::kF32;

class KvCache {
 public:
  // dtype: kF32 or kF16. K and V are allocated (zero-filled) through `backend`.
  KvCache(kernels::Backend& backend, const ModelConfig& config, int32_t num_pages,
          int32_t page_size, kernels::DType dtype = kKvDefaultDType);

  // Bytes of K and V one page takes (the unit of --kv-memory accounting).
  static size_t bytes_per_page(const ModelConfig& config, int32_t page_size,
                               kernels::DType dtype = kKvDefaultDType);

  // A cache for one sequence of up to `num_tokens` tokens, and its block table (pages 0, 1, ...).
  struct Single;
  static Single for_one_sequence(kernels::Backend& backend, const ModelConfig& config,
                                 int32_t num_tokens, int32_t page_size = 16,
                                 kernels::DType dtype = kKvDefaultDType);

  int32_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return page_size_; }
  kernels::DType dtype() const { return dtype_; }

  // Writes one token's K and V ([num_kv_heads][head_dim] each, backend memory) for `layer` at
  // `position`.
  void write(int64_t layer, std::span<const int32_t> block_table, int32_t position, const float* k,
             const float* v);
  // The kernel's view of one layer of one sequence.
  kernels::PagedKv layer_view(int64_t layer, std::span<const int32_t> block_table) const;
  // Copy-on-write support: page `dst` becomes a copy of page `src` (all layers).
  void copy_page(int32_t src, int32_t dst);

  // Streams see the pool as one flat array of equal slices: page_size rows of one (layer, page,
  // kv head), numbered as kv/sparse_layout.h says, which is this layout: slice i is rows
  // [i * page_size, (i + 1) * page_size) of k and v.
  kv::SliceShape slice_shape() const {
    return {.num_layers = static_cast<int32_t>(num_layers_),
            .num_kv_heads = static_cast<int32_t>(num_kv_heads_),
            .page_size = page_size_,
            .num_pages = num_pages_};
  }
  // The kernel's view of one stream: one kv head whose "pages" are the given slices.
  kernels::PagedKv slice_view(std::span<const int32_t> slices, int32_t key_offset) const;
  // One head's K and V row ([head_dim] each, backend memory) into slot `slot` of slice `slice`.
  void write_row(int64_t slice, int32_t slot, const float* k, const float* v);
  // Many rows at once: row r of k and v (head_dim floats each, backend memory) goes to element
  // offset offsets[r] (row_offset()) of K and V. One store_kv_rows per K and V.
  void write_rows(kernels::Rows<const float> k, kernels::Rows<const float> v,
                  std::span<const int64_t> offsets);
  int64_t row_offset(int64_t slice, int32_t slot) const {
    return slice * head_stride_ + int64_t{slot} * head_dim_;
  }
  void copy_row(int64_t src_slice, int32_t src_slot, int64_t dst_slice, int32_t dst_slot);
  void copy_slice(int64_t src_slice, int64_t dst_slice);
  // Quest: the key summaries (kernels::KeySummaries: per channel min, then max) of slices
  // [first, end) of a stream, each full (page_size keys): slice b's 2 * head_dim floats go to
  // summaries + b * 2 * head_dim (backend memory).
  void summarize_slices(std::span<const int32_t> slices, int32_t first, int32_t end,
                        float* summaries) const;

 private:
  size_t element_size() const { return dtype_ == kernels::DType::kF16 ? 2 : 4; }
  // The K/V view of the element at `offset`: k/v (kF32) or k_f16/v_f16 (kF16).
  void set_bases(kernels::PagedKv& view, int64_t offset) const;

  kernels::Backend* backend_;
  int64_t num_layers_, num_kv_heads_, head_dim_;
  int32_t num_pages_, page_size_;
  kernels::DType dtype_;
  int64_t head_stride_, page_stride_, layer_stride_;  // in elements
  kernels::DeviceBuffer keys_, values_;  // [num_layers * layer_stride] elements of dtype_
};

struct KvCache::Single {
  KvCache cache;
  std::vector<int32_t> block_table;
};

}  // namespace sieve::model
