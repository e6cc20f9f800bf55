#include "model/kv_cache.h"

#include <algorithm>

#include "kernels/attention_scores.h"
#include "model/key_smoothing.h"
#include "util/error.h"

namespace sieve::model {

std::optional<kernels::DType> parse_kv_dtype(std::string_view name) {
  for (const kernels::DTypeTraits& traits : kernels::kDTypeTraits) {
    if (!traits.kv_name.empty() && traits.kv_name == name) return traits.dtype;
  }
  return std::nullopt;
}

std::string_view kv_dtype_name(kernels::DType dtype) {
  return kernels::is_kv_dtype(dtype) ? kernels::dtype_traits(dtype).kv_name
                                     : kernels::to_string(dtype);
}

void KvCache::check_dtype(const ModelConfig& config, kernels::DType dtype) {
  if (!kernels::is_kv_dtype(dtype)) {
    fail("the KV cache stores {} only, not {}", kKvDTypeNames, kernels::to_string(dtype));
  }
  const int64_t block = kernels::block_elems(dtype);
  if (kernels::is_block_kv_dtype(dtype) && config.head_dim % block != 0) {
    fail(
        "KV dtype {} stores every K/V row in blocks of {} values, so it needs a head_dim that is "
        "a multiple of {}; this model's head_dim is {}: use f32 or f16",
        kv_dtype_name(dtype), block, block, config.head_dim);
  }
}

KvCache::KvCache(kernels::Backend& backend, const ModelConfig& config, int32_t num_pages,
                 int32_t page_size, kernels::DType dtype, std::vector<int32_t> precise_streams,
                 int32_t num_spare_areas)
    : backend_(&backend),
      num_layers_(config.num_layers),
      num_kv_heads_(config.num_kv_heads),
      head_dim_(config.head_dim),
      num_pages_(num_pages),
      page_size_(page_size),
      dtype_(dtype),
      head_stride_(static_cast<int64_t>(page_size) * config.head_dim),
      page_stride_(head_stride_ * config.num_kv_heads),
      layer_stride_(page_stride_ * num_pages),
      precise_streams_(std::move(precise_streams)) {
  check_dtype(config, dtype);
  if (num_pages <= 0 || page_size <= 0)
    fail("KV cache needs pages (got {} pages of {} tokens)", num_pages, page_size);
  const size_t bytes = bytes_at(layer_stride_ * num_layers_);
  keys_ = backend.allocate(bytes);
  values_ = backend.allocate(bytes);
  if (precise_streams_.empty()) return;
  if (!kernels::is_block_kv_dtype(dtype))
    fail("precise KV streams keep an f16 copy beside q8 / q4 rows, not beside {}",
         kv_dtype_name(dtype));
  const int64_t num_streams = num_layers_ * num_kv_heads_;
  precise_rank_.assign(static_cast<size_t>(num_streams), -1);
  for (size_t r = 0; r < precise_streams_.size(); ++r) {
    const int32_t stream = precise_streams_[r];
    if (stream < 0 || stream >= num_streams || (r > 0 && stream <= precise_streams_[r - 1]))
      fail("precise KV streams must be ascending stream indices below {}", num_streams);
    precise_rank_[static_cast<size_t>(stream)] = static_cast<int32_t>(r);
  }
  if (num_spare_areas < 0) fail("a negative number of spare precise areas");
  // [area][slot][head_dim] halves: the pages' own areas, then the spares.
  num_areas_ = std::ssize(precise_streams_) * num_pages_ + num_spare_areas;
  const size_t precise_bytes =
      kernels::row_bytes(kernels::DType::kF16, area_row_offset(num_areas_, 0));
  precise_keys_ = backend.allocate(precise_bytes);
  precise_values_ = backend.allocate(precise_bytes);
}

size_t KvCache::bytes_per_page(const ModelConfig& config, int32_t page_size, kernels::DType dtype,
                               int64_t num_precise_streams) {
  check_dtype(config, dtype);
  const size_t row = kernels::row_bytes(dtype, config.head_dim);
  const size_t precise_row = kernels::row_bytes(kernels::DType::kF16, config.head_dim);
  // A page's own areas, and its share of the spares (exact: precise_row is a multiple of 64).
  const size_t own_areas =
      2 * static_cast<size_t>(page_size) * precise_row * static_cast<size_t>(num_precise_streams);
  const size_t spare_share = own_areas / kPagesPerSpareArea;
  return 2 * static_cast<size_t>(page_size) * row * config.num_kv_heads * config.num_layers +
         own_areas + spare_share;
}

int32_t KvCache::spare_areas_for(int32_t num_pages, int64_t num_precise_streams) {
  return static_cast<int32_t>(num_precise_streams * num_pages / kPagesPerSpareArea);
}

KvCache::Single KvCache::for_one_sequence(kernels::Backend& backend, const ModelConfig& config,
                                          int32_t num_tokens, int32_t page_size,
                                          kernels::DType dtype,
                                          std::vector<int32_t> precise_streams) {
  const int32_t num_pages = std::max(1, (num_tokens + page_size - 1) / page_size);
  std::vector<int32_t> table(num_pages);
  for (int32_t i = 0; i < num_pages; ++i) table[i] = i;
  const int32_t num_spare = spare_areas_for(num_pages, std::ssize(precise_streams));
  return {
      KvCache(backend, config, num_pages, page_size, dtype, std::move(precise_streams), num_spare),
      std::move(table)};
}

bool KvCache::layer_has_precise_streams(int64_t layer) const {
  for (int32_t stream : precise_streams_)
    if (stream / num_kv_heads_ == layer) return true;
  return false;
}

kernels::PagedKv KvCache::head_view(int64_t layer, int64_t kv_head,
                                    std::span<const int32_t> block_table) const {
  const int32_t rank = precise_rank(layer, kv_head);
  if (rank < 0) {
    kernels::PagedKv view = layer_view(layer, block_table);
    view.num_kv_heads = 1;
    set_bases(view, layer * layer_stride_ + kv_head * head_stride_);
    return view;
  }
  // Page p's own area of this rank is area rank * num_pages + p: the block table read from
  // rank * num_pages areas on.
  kernels::PagedKv view = area_view(block_table, 0);
  const int64_t base = precise_row_offset(rank, 0, 0);
  view.k_f16 += base;
  view.v_f16 += base;
  return view;
}

kernels::PagedKv KvCache::area_view(std::span<const int32_t> areas, int32_t key_offset) const {
  return {.page_stride = head_stride_,
          .head_stride = head_stride_,
          .page_size = page_size_,
          .head_dim = head_dim_,
          .num_kv_heads = 1,
          .block_table = areas,
          .key_offset = key_offset,
          .dtype = kernels::DType::kF16,
          .k_f16 = precise_keys_.as<const uint16_t>(),
          .v_f16 = precise_values_.as<const uint16_t>()};
}

void KvCache::copy_precise(int64_t src, int64_t dst, int64_t elements) {
  const size_t bytes = static_cast<size_t>(elements) * sizeof(uint16_t);
  for (const kernels::DeviceBuffer* data : {&precise_keys_, &precise_values_}) {
    auto* base = static_cast<uint16_t*>(data->data());
    backend_->copy(base + dst, base + src, bytes);
  }
}

void KvCache::copy_area_row(int32_t src_area, int32_t src_slot, int32_t dst_area,
                            int32_t dst_slot) {
  copy_precise(area_row_offset(src_area, src_slot), area_row_offset(dst_area, dst_slot), head_dim_);
}

void KvCache::copy_area(int32_t src_area, int32_t dst_area) {
  copy_precise(area_row_offset(src_area, 0), area_row_offset(dst_area, 0), head_stride_);
}

void KvCache::write_precise_rows(kernels::Rows<const float> k, kernels::Rows<const float> v,
                                 std::span<const int64_t> offsets) {
  backend_->store_kv_rows(k, head_dim_, kernels::DType::kF16, precise_keys_.data(), offsets);
  backend_->store_kv_rows(v, head_dim_, kernels::DType::kF16, precise_values_.data(), offsets);
}

void KvCache::set_bases(kernels::PagedKv& view, int64_t offset) const {
  if (kernels::is_block_kv_dtype(dtype_)) {
    view.k_q = keys_.as<const uint8_t>() + bytes_at(offset);
    view.v_q = values_.as<const uint8_t>() + bytes_at(offset);
  } else if (dtype_ == kernels::DType::kF16) {
    view.k_f16 = keys_.as<const uint16_t>() + offset;
    view.v_f16 = values_.as<const uint16_t>() + offset;
  } else {
    view.k = keys_.as<const float>() + offset;
    view.v = values_.as<const float>() + offset;
  }
}

void KvCache::write(int64_t layer, std::span<const int32_t> block_table, int32_t position,
                    const float* k, const float* v) {
  const kv::SliceShape shape = slice_shape();
  const kv::PageId page{block_table[position / page_size_]};
  std::vector<int64_t> offsets(static_cast<size_t>(shape.num_kv_heads));
  for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
    const kv::SliceId slice = shape.dense_slice(page, shape.stream_index(layer, h));
    offsets[h] = row_offset(slice.value, position % page_size_);
  }
  write_rows({k, head_dim_}, {v, head_dim_}, offsets);
}

kernels::PagedKv KvCache::layer_view(int64_t layer, std::span<const int32_t> block_table) const {
  kernels::PagedKv view{.page_stride = page_stride_,
                        .head_stride = head_stride_,
                        .page_size = page_size_,
                        .head_dim = head_dim_,
                        .num_kv_heads = num_kv_heads_,
                        .block_table = block_table,
                        .dtype = dtype_};
  set_bases(view, layer * layer_stride_);
  return view;
}

void KvCache::copy_elements(int64_t src, int64_t dst, int64_t elements) {
  const size_t bytes = bytes_at(elements);
  for (const kernels::DeviceBuffer* data : {&keys_, &values_}) {
    auto* base = static_cast<uint8_t*>(data->data());
    backend_->copy(base + bytes_at(dst), base + bytes_at(src), bytes);
  }
}

void KvCache::copy_page(int32_t src, int32_t dst) {
  for (int64_t layer = 0; layer < num_layers_; ++layer) {
    const int64_t layer_base = layer * layer_stride_;
    copy_elements(layer_base + src * page_stride_, layer_base + dst * page_stride_, page_stride_);
  }
  for (int32_t rank = 0; rank < std::ssize(precise_streams_); ++rank)
    copy_precise(precise_row_offset(rank, src, 0), precise_row_offset(rank, dst, 0), head_stride_);
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
  set_bases(kv, 0);
  return kv;
}

void KvCache::write_row(int64_t slice, int32_t slot, const float* k, const float* v) {
  const int64_t offset = row_offset(slice, slot);
  write_rows({k, head_dim_}, {v, head_dim_}, std::span<const int64_t>(&offset, 1));
}

void KvCache::write_rows(kernels::Rows<const float> k, kernels::Rows<const float> v,
                         std::span<const int64_t> offsets) {
  backend_->store_kv_rows(k, head_dim_, dtype_, keys_.data(), offsets);
  backend_->store_kv_rows(v, head_dim_, dtype_, values_.data(), offsets);
}

void KvCache::copy_row(int64_t src_slice, int32_t src_slot, int64_t dst_slice, int32_t dst_slot) {
  copy_elements(row_offset(src_slice, src_slot), row_offset(dst_slice, dst_slot), head_dim_);
}

void KvCache::copy_slice(int64_t src_slice, int64_t dst_slice) {
  // A slice's page_size rows are contiguous: one copy per K and V.
  copy_elements(row_offset(src_slice, 0), row_offset(dst_slice, 0), head_stride_);
}

void KvCache::summarize_slices(int32_t stream, std::span<const int32_t> slices,
                               std::span<const int32_t> areas, int32_t first, int32_t end,
                               bool key_halves, float* summaries) const {
  // A precise stream's f16 copy where it has one: the keys it attends.
  const auto keys_of = [&](std::span<const int32_t> blocks) {
    return areas.empty() ? slice_view(blocks, 0) : area_view(blocks, 0);
  };
  const std::span<const int32_t> blocks = areas.empty() ? slices : areas;
  const kernels::PagedKv keys = keys_of(blocks);
  const int64_t summary_floats = kernels::key_summary_floats(head_dim_, page_size_, key_halves);
  const bool rotated =
      key_smoothing_ && key_smoothing_->rotates(stream / num_kv_heads_, stream % num_kv_heads_);
  if (!rotated) {
    for (int32_t b = first; b < end; ++b) {
      backend_->summarize_page_keys(
          keys, b, page_size_,
          {.data = summaries + b * summary_floats, .page_stride = 0, .key_halves = key_halves});
    }
    return;
  }
  // The slices' keys as f32, rotated back (the normalized transform is its own inverse), and
  // summarized from there; kChunk slices at a time (one gather and one rotation each), so the
  // f32 rows stay in L2 between the three passes.
  constexpr int32_t kChunk = 64;
  const int64_t group = KeySmoothing::rotation_group(head_dim_);
  const int64_t chunk_rows = int64_t{std::min(kChunk, end - first)} * page_size_;
  kernels::DeviceBuffer buffer =
      backend_->allocate(static_cast<size_t>(chunk_rows * head_dim_) * sizeof(float));
  float* unrotated = buffer.as<float>();
  std::vector<int32_t> pages(static_cast<size_t>(kChunk));
  for (int32_t b = 0; b < kChunk; ++b) pages[static_cast<size_t>(b)] = b;
  const kernels::PagedKv view{.k = unrotated,
                              .v = unrotated,
                              .page_stride = page_size_ * head_dim_,
                              .head_stride = page_size_ * head_dim_,
                              .page_size = page_size_,
                              .head_dim = head_dim_,
                              .num_kv_heads = 1,
                              .block_table = pages};
  for (int32_t b0 = first; b0 < end; b0 += kChunk) {
    const int32_t count = std::min(kChunk, end - b0);
    const int64_t rows = int64_t{count} * page_size_;
    backend_->gather_keys(
        keys_of(blocks.subspan(static_cast<size_t>(b0), static_cast<size_t>(count))), rows,
        unrotated);
    backend_->rotate_heads({unrotated, head_dim_}, rows, head_dim_ / group, group);
    for (int32_t b = 0; b < count; ++b) {
      backend_->summarize_page_keys(view, b, page_size_,
                                    {.data = summaries + (b0 + b) * summary_floats,
                                     .page_stride = 0,
                                     .key_halves = key_halves});
    }
  }
}

}  // namespace sieve::model
