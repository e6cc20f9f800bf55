#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace sieve::model {

namespace {

size_t element_bytes(kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return 4;
    case kernels::DType::kF16:
      return 2;
    default:
      fail("KV cache dtype must be f32 or f16 (got {})", kernels::to_string(dtype));
  }
}

template <typename T>
void copy_page_of_layers(std::vector<T>& data, int64_t num_layers, int64_t layer_stride,
                         int64_t page_stride, int32_t src, int32_t dst) {
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const auto base = data.begin() + layer * layer_stride;
    std::copy_n(base + src * page_stride, page_stride, base + dst * page_stride);
  }
}

}  // namespace

KvCache::KvCache(const ModelConfig& config, int32_t num_pages, int32_t page_size,
                 kernels::DType dtype)
    : num_layers_(config.num_layers),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      num_pages_(num_pages),
      page_size_(page_size),
      dtype_(dtype),
      head_stride_(static_cast<int64_t>(page_size) * config.head_dim),
      page_stride_(head_stride_ * config.num_kv_heads),
      layer_stride_(page_stride_ * num_pages) {
  if (num_pages <= 0 || page_size <= 0)
    fail("KV cache needs pages (got {} pages of {} tokens)", num_pages, page_size);
  const size_t size = static_cast<size_t>(layer_stride_) * num_layers_;
  if (element_bytes(dtype) == 2) {
    keys16_.resize(size);
    values16_.resize(size);
  } else {
    keys_.resize(size);
    values_.resize(size);
  }
}

size_t KvCache::bytes_per_page(const ModelConfig& config, int32_t page_size, kernels::DType dtype) {
  return 2 * element_bytes(dtype) * static_cast<size_t>(page_size) * config.head_dim *
         config.num_kv_heads * config.num_layers;
}

KvCache::Single KvCache::for_one_sequence(const ModelConfig& config, int32_t num_tokens,
                                          int32_t page_size, kernels::DType dtype) {
  const int32_t num_pages = std::max(1, (num_tokens + page_size - 1) / page_size);
  std::vector<int32_t> table(num_pages);
  for (int32_t i = 0; i < num_pages; ++i) table[i] = i;
  return {KvCache(config, num_pages, page_size, dtype), std::move(table)};
}

void KvCache::write(int64_t layer, std::span<const int32_t> block_table, int32_t position,
                    const float* k, const float* v) {
  const kv::SliceShape shape = slice_shape();
  const kv::PageId page{block_table[position / page_size_]};
  for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
    const kv::SliceId slice = shape.dense_slice(page, shape.stream_index(layer, h));
    write_row(slice.value, position % page_size_, k + h * head_dim_, v + h * head_dim_);
  }
}

kernels::PagedKv KvCache::layer_view(int64_t layer, std::span<const int32_t> block_table) const {
  kernels::PagedKv view{.page_stride = page_stride_,
                        .head_stride = head_stride_,
                        .page_size = page_size_,
                        .head_dim = head_dim_,
                        .num_kv_heads = num_kv_heads_,
                        .block_table = block_table,
                        .dtype = dtype_};
  if (dtype_ == kernels::DType::kF16) {
    view.k_f16 = keys16_.data() + layer * layer_stride_;
    view.v_f16 = values16_.data() + layer * layer_stride_;
  } else {
    view.k = keys_.data() + layer * layer_stride_;
    view.v = values_.data() + layer * layer_stride_;
  }
  return view;
}

void KvCache::copy_page(int32_t src, int32_t dst) {
  if (dtype_ == kernels::DType::kF16) {
    copy_page_of_layers(keys16_, num_layers_, layer_stride_, page_stride_, src, dst);
    copy_page_of_layers(values16_, num_layers_, layer_stride_, page_stride_, src, dst);
  } else {
    copy_page_of_layers(keys_, num_layers_, layer_stride_, page_stride_, src, dst);
    copy_page_of_layers(values_, num_layers_, layer_stride_, page_stride_, src, dst);
  }
}

kernels::PagedKv KvCache::slice_view(std::span<const int32_t> slices, int32_t key_offset) const {
  kernels::PagedKv kv{.page_stride = head_stride_,
                      .head_stride = head_stride_,
                      .page_size = page_size_,
                      .head_dim = head_dim_,
                      .num_kv_heads = 1,
                      .block_table = slices,
                      .key_offset = key_offset,
                      .dtype = dtype_};
  if (dtype_ == kernels::DType::kF16) {
    kv.k_f16 = keys16_.data();
    kv.v_f16 = values16_.data();
  } else {
    kv.k = keys_.data();
    kv.v = values_.data();
  }
  return kv;
}

void KvCache::write_row(int64_t slice, int32_t slot, const float* k, const float* v) {
  const int64_t offset = slice * head_stride_ + static_cast<int64_t>(slot) * head_dim_;
  if (dtype_ == kernels::DType::kF16) {
    for (int64_t d = 0; d < head_dim_; ++d) {
      keys16_[offset + d] = kernels::f32_to_f16(k[d]);
      values16_[offset + d] = kernels::f32_to_f16(v[d]);
    }
  } else {
    std::copy_n(k, head_dim_, keys_.begin() + offset);
    std::copy_n(v, head_dim_, values_.begin() + offset);
  }
}

void KvCache::copy_row(int64_t src_slice, int32_t src_slot, int64_t dst_slice, int32_t dst_slot) {
  const int64_t src = src_slice * head_stride_ + static_cast<int64_t>(src_slot) * head_dim_;
  const int64_t dst = dst_slice * head_stride_ + static_cast<int64_t>(dst_slot) * head_dim_;
  if (dtype_ == kernels::DType::kF16) {
    std::copy_n(keys16_.begin() + src, head_dim_, keys16_.begin() + dst);
    std::copy_n(values16_.begin() + src, head_dim_, values16_.begin() + dst);
  } else {
    std::copy_n(keys_.begin() + src, head_dim_, keys_.begin() + dst);
    std::copy_n(values_.begin() + src, head_dim_, values_.begin() + dst);
  }
}

void KvCache::copy_slice(int64_t src_slice, int64_t dst_slice) {
  for (int32_t slot = 0; slot < page_size_; ++slot) copy_row(src_slice, slot, dst_slice, slot);
}

}  // namespace sieve::model
