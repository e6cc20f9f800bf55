#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace sieve::model {

KvCache::KvCache(const ModelConfig& config, int32_t num_pages, int32_t page_size)
    : num_layers_(config.num_layers),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      num_pages_(num_pages),
      page_size_(page_size),
      head_stride_(static_cast<int64_t>(page_size) * config.head_dim),
      layer_stride_(head_stride_ * config.num_kv_heads),
      page_stride_(layer_stride_ * config.num_layers) {
  if (num_pages <= 0 || page_size <= 0) fail("KV cache needs pages (got {} pages of {} tokens)", num_pages, page_size);
  keys_.resize(static_cast<size_t>(page_stride_) * num_pages);
  values_.resize(keys_.size());
}

size_t KvCache::bytes_per_page(const ModelConfig& config, int32_t page_size) {
  return 2 * sizeof(float) * static_cast<size_t>(page_size) * config.head_dim * config.num_kv_heads *
         config.num_layers;
}

KvCache::Single KvCache::for_one_sequence(const ModelConfig& config, int32_t num_tokens, int32_t page_size) {
  const int32_t num_pages = std::max(1, (num_tokens + page_size - 1) / page_size);
  std::vector<int32_t> table(num_pages);
  for (int32_t i = 0; i < num_pages; ++i) table[i] = i;
  return {KvCache(config, num_pages, page_size), std::move(table)};
}

void KvCache::write(int64_t layer, std::span<const int32_t> block_table, int32_t position,
                    const float* k, const float* v) {
  const int64_t page = block_table[position / page_size_];
  const int64_t base = page * page_stride_ + layer * layer_stride_ + (position % page_size_) * head_dim_;
  for (int64_t h = 0; h < num_kv_heads_; ++h) {
    std::memcpy(&keys_[base + h * head_stride_], k + h * head_dim_, head_dim_ * sizeof(float));
    std::memcpy(&values_[base + h * head_stride_], v + h * head_dim_, head_dim_ * sizeof(float));
  }
}

kernels::PagedKv KvCache::layer_view(int64_t layer, std::span<const int32_t> block_table) const {
  return {.k = keys_.data() + layer * layer_stride_,
          .v = values_.data() + layer * layer_stride_,
          .page_stride = page_stride_,
          .head_stride = head_stride_,
          .page_size = page_size_,
          .head_dim = head_dim_,
          .num_kv_heads = num_kv_heads_,
          .block_table = block_table};
}

void KvCache::copy_page(int32_t src, int32_t dst) {
  std::copy_n(keys_.begin() + src * page_stride_, page_stride_, keys_.begin() + dst * page_stride_);
  std::copy_n(values_.begin() + src * page_stride_, page_stride_, values_.begin() + dst * page_stride_);
}

}  // namespace sieve::model
