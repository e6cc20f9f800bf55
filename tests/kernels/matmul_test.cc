// matmul against ref::matmul for every dtype, on every SIMD target, over shapes that cut
// every tile and vector width (rows 1/3/64/67, num_x 1/2/3/5/17, odd cols; float prefill with
// num_x 40/43/71), with 1 and 3 threads; plus hand-computed values and weights beyond 2 GiB of
// row offsets.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/pack.h"
#include "kernels/ops.h"
#include "kernels_test_util.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

// magnitude[i][r] = sum_c |w[r][c] * x[i][c]|, with x as the kernel sees it (rounded to Q8_0
// for quantized weights): the scale of the rounding error a correct kernel may make.
std::vector<double> magnitudes(const MatrixView& w, const float* x, int64_t num_x) {
  std::vector<float> w_row(w.cols), x_row(w.cols);
  std::vector<uint8_t> x_q8(is_quantized(w.dtype) ? row_bytes(DType::kQ8_0, w.cols) : 0);
  std::vector<double> mags(static_cast<size_t>(num_x * w.rows));
  for (int64_t i = 0; i < num_x; ++i) {
    std::memcpy(x_row.data(), x + i * w.cols, w.cols * sizeof(float));
    if (is_quantized(w.dtype)) {
      quantize_row(DType::kQ8_0, x_row.data(), x_q8.data(), w.cols);
      dequantize_row(DType::kQ8_0, x_q8.data(), x_row.data(), w.cols);
    }
    for (int64_t r = 0; r < w.rows; ++r) {
      dequantize_row(w.dtype, static_cast<const uint8_t*>(w.data) + r * row_bytes(w.dtype, w.cols),
                     w_row.data(), w.cols);
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c)
        sum += std::fabs(static_cast<double>(w_row[c]) * x_row[c]);
      mags[i * w.rows + r] = sum;
    }
  }
  return mags;
}

class Matmul : public PerTargetTest {};

TEST_P(Matmul, FloatWeightsAnyShape) {
  constexpr DType kTypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  constexpr int64_t kCols[] = {1, 7, 8, 16, 33, 100, 172, 259};
  expect_matmul_matches_ref_any_shape(kTypes, kCols, 1, magnitudes);
}

// Prefill shapes: from 40 activation rows on, AVX-512 CPUs run F32 / F16 / BF16 in packed
// panels of 32 weight rows and 2048 columns (cpu/matmul_float_avx512.cc); rows around the panel,
// cols around the 16-column blocks and the slices, num_x cutting the 14-row activation tiles
// unevenly. Elsewhere the same shapes run the dot-product tiles.
TEST_P(Matmul, FloatWeightsManyActivationRows) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 4000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t cols : {1, 17, 259, 2048, 4100}) {
      for (int64_t rows : {1, 31, 33, 67}) {
        const TestMatrix w(dtype, rows, cols, ++seed);
        for (int64_t num_x : {40, 43, 71}) {
          if (cols * rows * num_x > (1 << 22) && num_x != 43) continue;  // test time
          for (ThreadPool* pool : {&pool1, &pool3})
            expect_matmul_matches_ref(w.view, num_x, *pool, ++seed, magnitudes);
        }
      }
    }
  }
}

// F16 / BF16 with the packed copy (groups of 64 rows, column by column): used on AVX3 where
// the CPU has AVX-512, for any number of activation rows. Rows around the 64-row groups and their
// 16-row vectors, cols around the 16-column vectors, num_x around the 6-row activation tiles and
// the 40 rows from which unpacked weights take the panels.
TEST_P(Matmul, PackedFloatWeights) {
  uint32_t seed = 7000;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int64_t cols : {1, 17, 259, 2100}) {
      for (int64_t rows : {1, 31, 64, 65, 130}) {
        const TestMatrix w(dtype, rows, cols, ++seed);
        const size_t packed_bytes = (rows + 63) / 64 * 64 * row_bytes(dtype, cols);
        if (cols * rows > 100000) {  // test time
          expect_packed_matmul_matches_ref(w.view, packed_bytes, {1, 7, 43}, seed, magnitudes,
                                           1e-5);
        } else {
          expect_packed_matmul_matches_ref(w.view, packed_bytes, {1, 2, 5, 6, 7, 13, 40, 43}, seed,
                                           magnitudes, 1e-5);
        }
      }
    }
  }
}

// Where the packed copy is used, each output sums its terms in column order whatever the number
// of activation rows (decode alone, a batch, a prefill), so a row's result is the same bits alone
// and in any batch: batch invariance for F16 / BF16 models.
TEST_P(Matmul, PackedFloatRowsEqualAloneAndInAnyBatch) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    if (!packed_matmul_supported(dtype) || active_target() != "AVX3") {
      GTEST_SKIP() << "the packed copy is not used on " << active_target();
    }
    const TestMatrix w(dtype, 97, 2100, 77);
    const PackedBytes packed = pack_for_matmul(w.view);
    MatrixView view = w.view;
    attach_packed(view, packed);
    constexpr int64_t kMaxX = 45;
    const std::vector<float> x = random_floats(kMaxX * w.view.cols, 78);
    std::vector<float> alone(kMaxX * w.view.rows);
    for (int64_t i = 0; i < kMaxX; ++i)
      matmul(view, x.data() + i * w.view.cols, 1, alone.data() + i * w.view.rows, pool);
    for (int64_t num_x : {2, 6, 7, 39, 40, 45}) {
      std::vector<float> batch(num_x * w.view.rows);
      matmul(view, x.data(), num_x, batch.data(), pool);
      for (int64_t k = 0; k < num_x * w.view.rows; ++k)
        ASSERT_EQ(batch[k], alone[k]) << to_string(dtype) << " num_x=" << num_x << " k=" << k;
    }
  }
}

TEST_P(Matmul, QuantizedWeightsAnyShape) {
  constexpr DType kTypes[] = {DType::kQ8_0, DType::kQ4_0};
  constexpr int64_t kCols[] = {32, 64, 96, 320};
  expect_matmul_matches_ref_any_shape(kTypes, kCols, 1000, magnitudes);
}

// Q8_0 with the packed copy (pack_for_matmul) attached: used on AVX3 where the CPU has
// VNNI, ignored elsewhere; either way the result is the reference's. Rows around the 16-row
// groups, num_x around the 8-row activation tiles; arbitrary bytes (w = -128, both signs of
// scale); a shape of 2 column slices.
TEST_P(Matmul, PackedQ8_0) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 3000;
  for (int64_t cols : {32, 64, 96, 320}) {
    for (int64_t rows : {1, 3, 16, 17, 64, 67, 100}) {
      const TestMatrix w(DType::kQ8_0, rows, cols, ++seed);
      const PackedBytes packed = pack_for_matmul(w.view);
      EXPECT_EQ(packed.size(), (rows + 15) / 16 * row_bytes(DType::kQ8_0, cols) * 16);
      MatrixView view = w.view;
      attach_packed(view, packed);
      for (int64_t num_x : {1, 2, 3, 5, 8, 9, 17}) {
        for (ThreadPool* pool : {&pool1, &pool3})
          expect_matmul_matches_ref(view, num_x, *pool, ++seed, magnitudes);
      }
    }
  }
  std::mt19937 rng(6);
  const int64_t rows = 37, cols = 256;
  std::vector<uint8_t> bytes(row_bytes(DType::kQ8_0, cols) * rows);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng());
  for (size_t offset = 0; offset < bytes.size(); offset += block_bytes(DType::kQ8_0)) {
    const uint16_t d = f32_to_f16(std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng));
    std::memcpy(&bytes[offset], &d, 2);
  }
  MatrixView raw{DType::kQ8_0, bytes.data(), rows, cols};
  const PackedBytes raw_packed = pack_for_matmul(raw);
  attach_packed(raw, raw_packed);
  for (int64_t num_x : {1, 4, 11})
    expect_matmul_matches_ref(raw, num_x, pool3, 40 + num_x, magnitudes);
  const TestMatrix big(DType::kQ8_0, 131, 2080, ++seed);
  const PackedBytes big_packed = pack_for_matmul(big.view);
  MatrixView big_view = big.view;
  attach_packed(big_view, big_packed);
  for (int64_t num_x : {1, 19})
    expect_matmul_matches_ref(big_view, num_x, pool3, ++seed, magnitudes);
}

// Blocks of arbitrary bytes, not only what ggml's quantizer produces: Q8_0 values down to
// -128 (the int8 kernels take |w| as unsigned), every Q4_0 nibble, scales of both signs.
TEST_P(Matmul, QuantizedWeightsRawRandomBlocks) {
  ThreadPool pool(3);
  std::mt19937 rng(5);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    const int64_t rows = 37, cols = 256;
    std::vector<uint8_t> bytes(row_bytes(dtype, cols) * rows);
    for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng());
    for (size_t offset = 0; offset < bytes.size(); offset += block_bytes(dtype)) {
      const float scale = std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
      const uint16_t d = f32_to_f16(scale);
      std::memcpy(&bytes[offset], &d, 2);
    }
    const MatrixView w{dtype, bytes.data(), rows, cols};
    for (int64_t num_x : {1, 4, 7})
      expect_matmul_matches_ref(w, num_x, pool, 17 + num_x, magnitudes);
  }
}

// With weight matrices that pick single columns (y[i][r] = x_q8[i][r], exact in f32), the
// kernels' own (SIMD) activation quantizer must reproduce quantize_activations_q8 bit for bit
// (ggml's x86 quantize_row_q8_0: x * (127 / max|x|), ties to even).
TEST_P(Matmul, ActivationsQuantizeExactlyLikeTheReference) {
  ThreadPool pool(3);
  const int64_t cols = 96;
  std::vector<float> x = random_floats(3 * cols, 11, -3.0f, 3.0f);
  x[0] = 127.0f;  // block 0 of row 0: d = 1, so x * id is x itself: exact ties
  for (int j = 1; j < 32; ++j) x[j] = (j % 2 ? 0.5f : -0.5f) + static_cast<float>(j - 16);
  for (int j = 32; j < 64; ++j) x[j] = 0.0f;  // block 1: all zero, d = 0
  x[cols + 40] = -1e-20f;                     // a tiny block maximum
  std::vector<float> expected(x.size());
  std::vector<int8_t> q(cols);
  std::vector<float> d(cols / 32);
  for (int64_t i = 0; i < 3; ++i) {
    quantize_activations_q8(x.data() + i * cols, cols, q.data(), d.data(), nullptr);
    for (int64_t c = 0; c < cols; ++c) expected[i * cols + c] = d[c / 32] * q[c];
  }
  EXPECT_EQ(expected[1], -14.0f);  // -14.5: ties to even (roundf: -15)
  EXPECT_EQ(expected[17], 2.0f);   // 1.5
  EXPECT_EQ(expected[19], 4.0f);   // 3.5

  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    // Row r: weight 1 at column r, 0 elsewhere. Every block has d = 1 (f16 0x3C00); Q8_0 holds
    // q = 1 / 0, Q4_0 nibbles 9 / 8 (weight = nibble - 8).
    const size_t bytes_per_block = block_bytes(dtype);
    std::vector<uint8_t> bytes(row_bytes(dtype, cols) * cols);
    for (int64_t r = 0; r < cols; ++r) {
      for (int64_t b = 0; b < cols / 32; ++b) {
        uint8_t* block = bytes.data() + r * row_bytes(dtype, cols) + b * bytes_per_block;
        block[0] = 0x00;
        block[1] = 0x3C;
        std::memset(block + 2, dtype == DType::kQ8_0 ? 0x00 : 0x88, bytes_per_block - 2);
      }
      uint8_t* block = bytes.data() + r * row_bytes(dtype, cols) + (r / 32) * bytes_per_block;
      const int64_t j = r % 32;
      if (dtype == DType::kQ8_0) {
        block[2 + j] = 1;
      } else {
        block[2 + j % 16] = j < 16 ? 0x89 : 0x98;
      }
    }
    const MatrixView w{dtype, bytes.data(), cols, cols};
    for (int64_t num_x : {1, 3}) {
      std::vector<float> y(num_x * cols);
      matmul(w, x.data(), num_x, y.data(), pool);
      for (int64_t k = 0; k < num_x * cols; ++k) {
        ASSERT_EQ(y[k], expected[k])
            << to_string(dtype) << " num_x=" << num_x << " x=" << x[k] << " k=" << k;
      }
    }
  }
}

TEST_P(Matmul, LargerShapes) {
  ThreadPool pool(3);
  uint32_t seed = 2000;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    const TestMatrix decode(dtype, 515, 4096, ++seed);
    expect_matmul_matches_ref(decode.view, 1, pool, ++seed, magnitudes);
    const TestMatrix prefill(dtype, 131, 2080, ++seed);  // 2 column slices of 1024 + 32
    expect_matmul_matches_ref(prefill.view, 19, pool, ++seed, magnitudes);
  }
}

TEST_P(Matmul, EmptyShapesWriteNothing) {
  ThreadPool pool(3);
  const TestMatrix w(DType::kQ8_0, 5, 64, 1);
  const std::vector<float> x(64 * 2, 1.0f);
  float y[10] = {};
  matmul(MatrixView{DType::kQ8_0, w.view.data, 0, 64}, x.data(), 2, y, pool);
  matmul(w.view, x.data(), 0, y, pool);
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

// y = W x for hand-made inputs, on every target and in the reference.
TEST_P(Matmul, HandComputedValues) {
  ThreadPool pool(1);
  // F32: [[1 2 3] [-1 0.5 4]] x [1 1 2]  = [9, 7.5]
  const float w_f32[] = {1, 2, 3, -1, 0.5f, 4};
  const float x3[] = {1, 1, 2};
  float y[2];
  for (bool reference : {false, true}) {
    const MatrixView w{DType::kF32, w_f32, 2, 3};
    reference ? ref::matmul(w, x3, 1, y) : matmul(w, x3, 1, y, pool);
    EXPECT_EQ(y[0], 9.0f);
    EXPECT_EQ(y[1], 7.5f);
  }
  // Q8_0 weights q[j] = j, d = 1 against x = 1: x quantizes to q = 127, d_x = f16(1/127),
  // so y = 1 * f16(1/127) * 127 * sum(j) = f16(1/127) * 62992 (ggml's vec_dot_q8_0_q8_0).
  uint8_t block[34];
  const uint16_t one = 0x3C00;
  std::memcpy(block, &one, 2);
  for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<uint8_t>(j);
  const std::vector<float> ones(32, 1.0f);
  const float expected = f16_to_f32(f32_to_f16(1.0f / 127.0f)) * 62992.0f;
  for (bool reference : {false, true}) {
    const MatrixView w{DType::kQ8_0, block, 1, 32};
    reference ? ref::matmul(w, ones.data(), 1, y) : matmul(w, ones.data(), 1, y, pool);
    EXPECT_FLOAT_EQ(y[0], expected);
  }
  // Q4_0 with every nibble 0xF (weight 15 - 8 = 7) and d = 0.5: y = 0.5 * 7 * f16(1/127) * 127
  // * 32.
  uint8_t block4[18];
  const uint16_t half = 0x3800;
  std::memcpy(block4, &half, 2);
  std::memset(block4 + 2, 0xFF, 16);
  const float expected4 = 0.5f * 7 * f16_to_f32(f32_to_f16(1.0f / 127.0f)) * 127 * 32;
  for (bool reference : {false, true}) {
    const MatrixView w{DType::kQ4_0, block4, 1, 32};
    reference ? ref::matmul(w, ones.data(), 1, y) : matmul(w, ones.data(), 1, y, pool);
    EXPECT_FLOAT_EQ(y[0], expected4);
  }
}

// A matrix whose last rows start beyond 2^31 bytes: row offsets must be computed in 64 bits.
// Backed by a sparse anonymous mapping (zero pages, nothing allocated until written); only
// the last few rows hold data. The kernels read all of it (~2 GiB of zero pages) per call.
TEST_P(Matmul, RowOffsetsBeyond2GiB) {
  ThreadPool pool(3);
  for (DType dtype : {DType::kF32, DType::kQ8_0}) {  // FloatKernel and QuantKernel
    const int64_t cols = dtype == DType::kF32 ? (1 << 18) : (1 << 19);
    const size_t bytes_per_row = row_bytes(dtype, cols);
    const int64_t rows = static_cast<int64_t>((size_t{1} << 31) / bytes_per_row) + 3;
    const size_t total = bytes_per_row * rows;
    ASSERT_GT(total - 2 * bytes_per_row, size_t{1} << 31);  // the last 2 rows start past 2 GiB
    void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) GTEST_SKIP() << "cannot map " << total << " bytes";
    // Transparent huge pages, where the kernel allows them: the reads then fault in the huge zero
    // page 1,024 times instead of 4 KiB pages 524,288 times (25x faster, the same bytes read).
    madvise(mem, total, MADV_HUGEPAGE);
    auto* base = static_cast<uint8_t*>(mem);
    const int64_t num_data_rows = 3;
    const TestMatrix tail(dtype, num_data_rows, cols, 77);
    std::memcpy(base + (rows - num_data_rows) * bytes_per_row, tail.bytes.data(),
                num_data_rows * bytes_per_row);

    const MatrixView w{dtype, base, rows, cols};
    for (int64_t num_x : {1, 2}) {
      const std::vector<float> x = random_floats(num_x * cols, 78);
      std::vector<float> y(num_x * rows, 1.0f), y_tail(num_x * num_data_rows);
      matmul(w, x.data(), num_x, y.data(), pool);
      ref::matmul(tail.view, x.data(), num_x, y_tail.data());
      const std::vector<double> mags = magnitudes(tail.view, x.data(), num_x);
      for (int64_t i = 0; i < num_x; ++i) {
        for (int64_t r = 0; r < rows - num_data_rows; r += 97)
          ASSERT_EQ(y[i * rows + r], 0.0f) << r;
        for (int64_t r = 0; r < num_data_rows; ++r) {
          const int64_t k = i * num_data_rows + r;
          EXPECT_NEAR(y[i * rows + rows - num_data_rows + r], y_tail[k], 1e-5 * mags[k])
              << to_string(dtype) << " row " << rows - num_data_rows + r;
        }
      }
    }
    munmap(mem, total);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, Matmul, ::testing::ValuesIn(available_targets()),
                         target_test_name);

}  // namespace
}  // namespace sieve::kernels
