// KvCache in every dtype: exact bytes per page, rows written and moved (copy_row, copy_slice,
// copy_page) read back as their quantized values, and a clear error for a head_dim the block
// dtypes cannot store.
#include "model/kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/ops.h"
#include "kernels/paged_attention.h"
#include "model/key_smoothing.h"
#include "util/error.h"

namespace sieve::model {
namespace {

using kernels::DType;

constexpr DType kAllDTypes[] = {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1};

ModelConfig shape(int64_t num_layers, int64_t num_kv_heads, int64_t head_dim) {
  ModelConfig c;
  c.num_layers = num_layers;
  c.num_kv_heads = num_kv_heads;
  c.num_heads = 2 * num_kv_heads;
  c.head_dim = head_dim;
  return c;
}

// What a row of `dtype` reads back as: x rounded through the dtype's storage.
std::vector<float> stored(DType dtype, const std::vector<float>& x) {
  std::vector<uint8_t> bytes(kernels::row_bytes(dtype, std::ssize(x)));
  std::vector<float> out(x.size());
  kernels::quantize_row(dtype, x.data(), bytes.data(), std::ssize(x));
  kernels::dequantize_row(dtype, bytes.data(), out.data(), std::ssize(x));
  return out;
}

TEST(KvDType, NamesRoundTrip) {
  for (DType dtype : kAllDTypes) {
    const std::optional<DType> parsed = parse_kv_dtype(kv_dtype_name(dtype));
    ASSERT_TRUE(parsed.has_value()) << kv_dtype_name(dtype);
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(kv_dtype_name(DType::kQ8_0), "q8");
  EXPECT_EQ(kv_dtype_name(DType::kQ4_1), "q4");
  for (const char* bad : {"", "q8_0", "F16", "bf16", "q5"})
    EXPECT_FALSE(parse_kv_dtype(bad)) << bad;
}

TEST(KvCache, BytesPerPageIsExactForEachDType) {
  const ModelConfig c = shape(3, 2, 64);
  const size_t rows = 2 * 3 * 2 * 16;  // K and V x layers x kv heads x slots
  EXPECT_EQ(KvCache::bytes_per_page(c, 16, DType::kF32), rows * 64 * 4);
  EXPECT_EQ(KvCache::bytes_per_page(c, 16, DType::kF16), rows * 64 * 2);
  EXPECT_EQ(KvCache::bytes_per_page(c, 16, DType::kQ8_0), rows * 2 * 34);  // 2 blocks per row
  EXPECT_EQ(KvCache::bytes_per_page(c, 16, DType::kQ4_1), rows * 2 * 20);
  // What the header's bytes-per-token table says: per layer, K + V, per kv head.
  const ModelConfig one = shape(1, 1, 128);
  EXPECT_EQ(KvCache::bytes_per_page(one, 1, DType::kQ8_0), 272u);  // 2.125 * 128
  EXPECT_EQ(KvCache::bytes_per_page(one, 1, DType::kQ4_1), 160u);  // 1.25 * 128
  // Each precise stream adds its f16 K and V rows of the page, and a quarter of that for the
  // spare areas (kPagesPerSpareArea).
  EXPECT_EQ(KvCache::bytes_per_page(c, 16, DType::kQ8_0, 2),
            rows * 2 * 34 + 2 * 2 * 16 * 64 * 2 * 5 / 4);
  EXPECT_EQ(KvCache::spare_areas_for(100, 2), 50);
}

// A precise stream's rows of dense pages: written to the f16 copy (write_precise_rows), read
// through head_view as f16, carried by copy_page; the other heads' head_view is their slice of
// the layer view. Precise streams are refused beside f32 / f16 rows and out of order.
TEST(KvCache, PreciseStreamsKeepAnF16CopyOfDensePages) {
  const ModelConfig c = shape(2, 2, 64);
  constexpr int32_t kPages = 4, kPageSize = 4;
  const std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2);
  EXPECT_THROW(KvCache(*backend, c, kPages, kPageSize, DType::kF16, {1}), Error);
  EXPECT_THROW(KvCache(*backend, c, kPages, kPageSize, DType::kQ8_0, {2, 1}), Error);
  EXPECT_THROW(KvCache(*backend, c, kPages, kPageSize, DType::kQ8_0, {4}), Error);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_1}) {
    SCOPED_TRACE(std::string(kv_dtype_name(dtype)));
    // Stream 2 = layer 1, kv head 0.
    KvCache cache(*backend, c, kPages, kPageSize, dtype, {2});
    EXPECT_EQ(cache.precise_rank(1, 0), 0);
    EXPECT_EQ(cache.precise_rank(1, 1), -1);
    EXPECT_EQ(cache.precise_rank(0, 0), -1);
    EXPECT_TRUE(cache.layer_has_precise_streams(1));
    EXPECT_FALSE(cache.layer_has_precise_streams(0));
    // Page 1, every slot, both heads of layer 1: main rows and the precise head's f16 copy.
    std::vector<float> k(static_cast<size_t>(kPageSize * 2 * 64)), v(k.size());
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    const std::vector<int32_t> table = {1};
    std::vector<int64_t> offsets, precise_offsets;
    for (int32_t slot = 0; slot < kPageSize; ++slot) {
      for (int32_t h = 0; h < 2; ++h) {
        const kv::SliceId slice =
            cache.slice_shape().dense_slice(kv::PageId{1}, cache.slice_shape().stream_index(1, h));
        offsets.push_back(cache.row_offset(slice.value, slot));
      }
      precise_offsets.push_back(cache.precise_row_offset(0, 1, slot));
    }
    cache.write_rows({k.data(), 64}, {v.data(), 64}, offsets);
    cache.write_precise_rows({k.data(), 128}, {v.data(), 128}, precise_offsets);
    cache.copy_page(1, 3);
    std::vector<float> got(64);
    for (int32_t page : {1, 3}) {
      const std::vector<int32_t> read_table = {page};
      for (int32_t h = 0; h < 2; ++h) {
        const kernels::PagedKv view = cache.head_view(1, h, read_table);
        EXPECT_EQ(view.dtype, h == 0 ? DType::kF16 : dtype);
        for (int32_t slot = 0; slot < kPageSize; ++slot) {
          for (bool value : {false, true}) {
            const float* row = (value ? v.data() : k.data()) + (slot * 2 + h) * 64;
            kernels::load_kv_row(view, value, slot, 0, got.data());
            EXPECT_EQ(got, stored(view.dtype, std::vector<float>(row, row + 64)))
                << "page " << page << " head " << h << " slot " << slot;
            // The main rows of the precise head are written too (sparse sequences read them).
            kernels::load_kv_row(cache.layer_view(1, read_table), value, slot, h, got.data());
            EXPECT_EQ(got, stored(dtype, std::vector<float>(row, row + 64)));
          }
        }
      }
    }
    // Page 2 was never written: its f16 copy is zero.
    const std::vector<int32_t> untouched = {2};
    kernels::load_kv_row(cache.head_view(1, 0, untouched), false, 0, 0, got.data());
    EXPECT_EQ(got, std::vector<float>(64, 0.0f));
  }
}

TEST(KvCache, BlockDTypesNeedAHeadDimMultipleOf32) {
  const std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  for (const int64_t head_dim : {8, 48}) {
    const ModelConfig c = shape(2, 2, head_dim);
    for (DType dtype : {DType::kQ8_0, DType::kQ4_1}) {
      try {
        KvCache cache(*backend, c, 4, 16, dtype);
        ADD_FAILURE() << "head_dim " << head_dim << " accepted for " << kv_dtype_name(dtype);
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_NE(message.find(std::string(kv_dtype_name(dtype))), std::string::npos) << message;
        EXPECT_NE(message.find("head_dim is " + std::to_string(head_dim)), std::string::npos)
            << message;
      }
      EXPECT_THROW((void)KvCache::bytes_per_page(c, 16, dtype), Error);
    }
    for (DType dtype : {DType::kF32, DType::kF16}) {
      EXPECT_NO_THROW(KvCache(*backend, c, 4, 16, dtype));
    }
  }
  EXPECT_THROW(KvCache(*backend, shape(2, 2, 64), 4, 16, DType::kQ4_0), Error);
}

// Rows go in with write_rows, are moved by copy_row / copy_slice / copy_page, and every row
// reads back (load_kv_row, through slice and layer views) as the dtype's rounding of what was
// written: a row's scales travel with it.
// Quest's page summaries of a stream whose keys the key smoothing rotated are of the keys
// rotated back (per channel min / max over the page); a stream left unrotated is summarized as
// stored. q8 pages, one layer, kv head 0 rotated, kv head 1 not.
TEST(KvCache, QuestSummariesOfRotatedStreamsAreOfTheKeysRotatedBack) {
  constexpr int64_t kHeadDim = 64;
  constexpr int32_t kPageSize = 16;
  const ModelConfig c = shape(1, 2, kHeadDim);
  const std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(1);
  // Both streams precise, two spare areas: summaries of their f16 areas too.
  KvCache cache(*backend, c, 2, kPageSize, DType::kQ8_0, {0, 1}, 2);
  const KeySmoothing::Shape smoothing_shape{.num_layers = 1,
                                            .num_heads = c.num_heads,
                                            .num_kv_heads = c.num_kv_heads,
                                            .head_dim = kHeadDim,
                                            .rope_dims = kHeadDim,
                                            .rope_neox = false};
  const int64_t kv_dim = c.num_kv_heads * kHeadDim, q_dim = c.num_heads * kHeadDim;
  std::vector<float> host(static_cast<size_t>(2 * kv_dim + q_dim), 1.0f);
  std::fill(host.begin(), host.begin() + kv_dim, 0.0f);  // no shift, unit scales
  cache.set_key_smoothing(
      std::make_shared<KeySmoothing>(*backend, smoothing_shape, host, std::vector<uint8_t>{1, 0}));

  const kv::SliceShape slices = cache.slice_shape();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(2 * kPageSize * kHeadDim));
  for (float& x : k) x = normal(rng);
  // Channel 5 an outlier, as smoothing leaves some.
  for (int64_t r = 0; r < 2 * kPageSize; ++r) k[static_cast<size_t>(r * kHeadDim + 5)] *= 8.0f;
  std::vector<int64_t> offsets;
  for (int32_t stream = 0; stream < 2; ++stream) {
    for (int32_t slot = 0; slot < kPageSize; ++slot)
      offsets.push_back(cache.row_offset(slices.dense_slice(kv::PageId{0}, stream).value, slot));
  }
  cache.write_rows({k.data(), kHeadDim}, {k.data(), kHeadDim}, offsets);
  // Stream 0's f16 copy in spare area 4, stream 1's in page 1's area of rank 0 (area 1).
  const std::vector<int32_t> area_of = {4, 1};
  std::vector<int64_t> area_offsets;
  for (int32_t stream = 0; stream < 2; ++stream) {
    for (int32_t slot = 0; slot < kPageSize; ++slot)
      area_offsets.push_back(cache.area_row_offset(area_of[static_cast<size_t>(stream)], slot));
  }
  cache.write_precise_rows({k.data(), kHeadDim}, {k.data(), kHeadDim}, area_offsets);

  for (const bool f16_copy : {false, true}) {
    for (int32_t stream = 0; stream < 2; ++stream) {
      SCOPED_TRACE("stream " + std::to_string(stream) + (f16_copy ? ", its f16 copy" : ""));
      const std::vector<int32_t> table = {
          static_cast<int32_t>(slices.dense_slice(kv::PageId{0}, stream).value)};
      const std::vector<int32_t> areas = {area_of[static_cast<size_t>(stream)]};
      std::vector<float> got(
          static_cast<size_t>(kernels::key_summary_floats(kHeadDim, kPageSize, false)));
      cache.summarize_slices(stream, table, f16_copy ? areas : std::vector<int32_t>{}, 0, 1,
                             /*key_halves=*/false, got.data());
      std::vector<float> lo(kHeadDim, INFINITY), hi(kHeadDim, -INFINITY);
      for (int32_t slot = 0; slot < kPageSize; ++slot) {
        std::vector<float> row(kHeadDim);
        kernels::load_kv_row(f16_copy ? cache.area_view(areas, 0) : cache.slice_view(table, 0),
                             false, slot, 0, row.data());
        if (stream == 0) kernels::rotate_heads(row.data(), 1, 1, kHeadDim);
        for (int64_t ch = 0; ch < kHeadDim; ++ch) {
          lo[ch] = std::min(lo[ch], row[ch]);
          hi[ch] = std::max(hi[ch], row[ch]);
        }
      }
      for (int64_t ch = 0; ch < kHeadDim; ++ch) {
        EXPECT_FLOAT_EQ(got[ch], lo[ch]) << "min of channel " << ch;
        EXPECT_FLOAT_EQ(got[kHeadDim + ch], hi[ch]) << "max of channel " << ch;
      }
      if (f16_copy) {  // and the f16 rows are not the q8 ones: the copy was read
        std::vector<float> q8_row(kHeadDim), f16_row(kHeadDim);
        kernels::load_kv_row(cache.slice_view(table, 0), false, 0, 0, q8_row.data());
        kernels::load_kv_row(cache.area_view(areas, 0), false, 0, 0, f16_row.data());
        EXPECT_NE(q8_row, f16_row);
      }
    }
  }
}

TEST(KvCache, RowsSlicesAndPagesMoveWithTheirScales) {
  const ModelConfig c = shape(2, 2, 64);
  constexpr int32_t kPages = 6, kPageSize = 4;
  const std::unique_ptr<kernels::Backend> backend = kernels::make_cpu_backend(2);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (DType dtype : kAllDTypes) {
    SCOPED_TRACE(std::string(kv_dtype_name(dtype)));
    KvCache cache(*backend, c, kPages, kPageSize, dtype);
    const kv::SliceShape slices = cache.slice_shape();
    const int32_t num_streams = slices.num_layers * slices.num_kv_heads;
    // Source data: every slot of pages 0 and 1, each row with its own scale.
    std::vector<std::vector<float>> k_rows, v_rows;
    std::vector<int64_t> offsets;
    std::vector<float> k_flat, v_flat;
    const auto slice_of = [&](int32_t page, int32_t stream) {
      return slices.dense_slice(kv::PageId{page}, stream).value;
    };
    for (int32_t page : {0, 1}) {
      for (int32_t stream = 0; stream < num_streams; ++stream) {
        for (int32_t slot = 0; slot < kPageSize; ++slot) {
          const float scale = 0.1f + static_cast<float>(k_rows.size() % 7);
          std::vector<float> k(64), v(64);
          for (float& x : k) x = scale * normal(rng);
          for (float& x : v) x = scale * normal(rng) + 0.5f;
          k_flat.insert(k_flat.end(), k.begin(), k.end());
          v_flat.insert(v_flat.end(), v.begin(), v.end());
          k_rows.push_back(k);
          v_rows.push_back(v);
          offsets.push_back(cache.row_offset(slice_of(page, stream), slot));
        }
      }
    }
    cache.write_rows({k_flat.data(), 64}, {v_flat.data(), 64}, offsets);
    // Index of the source row of (page, stream, slot).
    const auto source = [&](int32_t page, int32_t stream, int32_t slot) {
      return static_cast<size_t>((page * num_streams + stream) * kPageSize + slot);
    };
    const auto expect_row = [&](int64_t slice, int32_t slot, size_t src, const char* what) {
      const std::vector<int32_t> table = {static_cast<int32_t>(slice)};
      std::vector<float> got(64);
      for (bool value : {false, true}) {
        kernels::load_kv_row(cache.slice_view(table, 0), value, slot, 0, got.data());
        EXPECT_EQ(got, stored(dtype, value ? v_rows[src] : k_rows[src]))
            << what << " slice " << slice << " slot " << slot << (value ? " V" : " K");
      }
    };
    for (int32_t stream = 0; stream < num_streams; ++stream) {
      for (int32_t slot = 0; slot < kPageSize; ++slot)
        expect_row(slice_of(0, stream), slot, source(0, stream, slot), "written");
    }

    // copy_row: slot 3 of (page 1, stream 2) into slot 1 of (page 4, stream 0).
    cache.copy_row(slice_of(1, 2), 3, slice_of(4, 0), 1);
    expect_row(slice_of(4, 0), 1, source(1, 2, 3), "copy_row");
    // copy_slice: (page 0, stream 3) into (page 5, stream 1), every slot.
    cache.copy_slice(slice_of(0, 3), slice_of(5, 1));
    for (int32_t slot = 0; slot < kPageSize; ++slot)
      expect_row(slice_of(5, 1), slot, source(0, 3, slot), "copy_slice");
    // copy_page: page 1 into page 3, every layer and kv head (read through a layer view).
    cache.copy_page(1, 3);
    const std::vector<int32_t> table = {3};
    std::vector<float> got(64);
    for (int64_t layer = 0; layer < c.num_layers; ++layer) {
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        const int32_t stream = slices.stream_index(static_cast<int32_t>(layer), h);
        for (int32_t slot = 0; slot < kPageSize; ++slot) {
          for (bool value : {false, true}) {
            kernels::load_kv_row(cache.layer_view(layer, table), value, slot, h, got.data());
            const size_t src = source(1, stream, slot);
            EXPECT_EQ(got, stored(dtype, value ? v_rows[src] : k_rows[src]))
                << "copy_page layer " << layer << " head " << h << " slot " << slot;
          }
        }
      }
    }
    // Nothing else moved: page 0 is intact and the rows around the copied one are still zero.
    for (int32_t stream = 0; stream < num_streams; ++stream) {
      for (int32_t slot = 0; slot < kPageSize; ++slot)
        expect_row(slice_of(0, stream), slot, source(0, stream, slot), "source after copies");
    }
    const std::vector<int32_t> copied_row_slice = {static_cast<int32_t>(slice_of(4, 0))};
    for (int32_t slot : {0, 2}) {
      kernels::load_kv_row(cache.slice_view(copied_row_slice, 0), false, slot, 0, got.data());
      EXPECT_EQ(got, std::vector<float>(64, 0.0f)) << "slot " << slot << " beside copy_row";
    }
  }
}

}  // namespace
}  // namespace sieve::model
