#pragma once
// The K/V floats of the whole page pool. Which pages a sequence uses is decided by kv::KvManager
// (integers only); this class only stores them. Layout (floats; V identical):
//
//   k[page][layer][kv_head][slot][head_dim]      slot in [0, page_size)
//
// so one page id covers every layer of page_size consecutive positions, and for a fixed
// (layer, kv head) the slots of a page are contiguous rows for the attention kernel.
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/paged_attention.h"
#include "model/config.h"

namespace sieve::model {

class KvCache {
 public:
  KvCache(const ModelConfig& config, int32_t num_pages, int32_t page_size);

  // Bytes of K and V one page takes (the unit of --kv-memory accounting).
  static size_t bytes_per_page(const ModelConfig& config, int32_t page_size);

  // A cache for one sequence of up to `num_tokens` tokens, and its block table (pages 0, 1, ...).
  struct Single;
  static Single for_one_sequence(const ModelConfig& config, int32_t num_tokens, int32_t page_size = 16);

  int32_t num_pages() const { return num_pages_; }
  int32_t page_size() const { return page_size_; }

  // Writes one token's K and V ([num_kv_heads][head_dim] each) for `layer` at `position`.
  void write(int64_t layer, std::span<const int32_t> block_table, int32_t position, const float* k,
             const float* v);
  // The kernel's view of one layer of one sequence.
  kernels::PagedKv layer_view(int64_t layer, std::span<const int32_t> block_table) const;
  // Copy-on-write support: page `dst` becomes a copy of page `src` (all layers).
  void copy_page(int32_t src, int32_t dst);

 private:
  int64_t num_layers_, num_kv_heads_, head_dim_;
  int32_t num_pages_, page_size_;
  int64_t head_stride_, layer_stride_, page_stride_;
  std::vector<float> keys_;
  std::vector<float> values_;
};

struct KvCache::Single {
  KvCache cache;
  std::vector<int32_t> block_table;
};

}  // namespace sieve::model
