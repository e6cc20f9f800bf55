// Super-block weight types (Q2_K .. Q6_K, IQ4_XS): layouts and quantizers checked against the
// files llama-quantize wrote (shared/golden/quant), and the SIMD matmul against ref::matmul on
// every target.
#include "kernels/quant_super_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/blocks.h"
#include "kernels/kernels_test_util.h"
#include "kernels/ops.h"
#include "shared_data.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

constexpr DType kSuperBlockTypes[] = {DType::kQ2_K, DType::kQ3_K, DType::kQ4_K,
                                      DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS};

std::optional<DType> super_block_dtype(gguf::TensorType type) {
  switch (type) {
    case gguf::TensorType::kQ2_K:
      return DType::kQ2_K;
    case gguf::TensorType::kQ3_K:
      return DType::kQ3_K;
    case gguf::TensorType::kQ4_K:
      return DType::kQ4_K;
    case gguf::TensorType::kQ5_K:
      return DType::kQ5_K;
    case gguf::TensorType::kQ6_K:
      return DType::kQ6_K;
    case gguf::TensorType::kIQ4_XS:
      return DType::kIQ4_XS;
    default:
      return std::nullopt;
  }
}

// Relative RMS error of each type on random weights, ~1.3x the worst measured on the golden
// files (the test prints it: 0.234, 0.126, 0.055, 0.028, 0.013, 0.065). A wrong decoding (swapped
// nibbles, scales, halves) gives ~1 or more.
double max_relative_rms(DType dtype) {
  switch (dtype) {
    case DType::kQ2_K:
      return 0.30;
    case DType::kQ3_K:
      return 0.16;
    case DType::kQ4_K:
      return 0.07;
    case DType::kQ5_K:
      return 0.035;
    case DType::kQ6_K:
      return 0.017;
    case DType::kIQ4_XS:
      return 0.08;
    default:
      return 0.0;
  }
}

std::vector<float> f16_tensor(const gguf::File& file, const gguf::TensorInfo& info) {
  EXPECT_EQ(info.type, gguf::TensorType::kF16) << info.name;
  const auto data = file.tensor_data(info);
  std::vector<float> values(info.num_elements());
  dequantize_row(DType::kF16, data.data(), values.data(), static_cast<int64_t>(values.size()));
  return values;
}

// For each quantized file: every super-block tensor dequantizes close to the F16 original and
// quantizes from the F16 tensor to exactly the bytes llama-quantize wrote (no importance
// matrix: ggml's reference quantizers).
TEST(SuperBlockGolden, DequantizeAndRequantizeLlamaQuantizeFiles) {
  const gguf::File base = gguf::File::open(testing::shared_path("golden/quant/base-F16.gguf"));
  std::map<DType, int> tensors_checked;
  std::map<DType, int> tensors_requantized;
  std::map<DType, double> worst_relative_rms;
  for (const char* name : {"Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S",
                           "Q5_K_M", "Q6_K", "IQ4_XS"}) {
    const gguf::File file =
        gguf::File::open(testing::shared_path(std::string("golden/quant/base-") + name + ".gguf"));
    for (const gguf::TensorInfo& info : file.tensors()) {
      const std::optional<DType> dtype = super_block_dtype(info.type);
      if (!dtype) continue;
      const gguf::TensorInfo* original = base.find_tensor(info.name);
      ASSERT_NE(original, nullptr) << info.name;
      ASSERT_EQ(original->shape, info.shape) << info.name;
      const std::vector<float> reference = f16_tensor(base, *original);
      const int64_t n = static_cast<int64_t>(reference.size());
      const auto data = file.tensor_data(info);
      ASSERT_EQ(data.size(), row_bytes(*dtype, n));

      std::vector<float> decoded(reference.size());
      dequantize_row(*dtype, data.data(), decoded.data(), n);
      double err2 = 0, ref2 = 0;
      for (int64_t k = 0; k < n; ++k) {
        err2 += (static_cast<double>(decoded[k]) - reference[k]) * (decoded[k] - reference[k]);
        ref2 += static_cast<double>(reference[k]) * reference[k];
      }
      const double relative_rms = std::sqrt(err2 / ref2);
      EXPECT_LT(relative_rms, max_relative_rms(*dtype))
          << name << " " << info.name << " " << to_string(*dtype);
      // Better than the next coarser grid: a decoding that loses a bit would not be.
      EXPECT_GT(relative_rms, 0.0) << name << " " << info.name;
      ++tensors_checked[*dtype];
      worst_relative_rms[*dtype] = std::max(worst_relative_rms[*dtype], relative_rms);

      std::vector<uint8_t> requantized(data.size());
      quantize_row(*dtype, reference.data(), requantized.data(), n);
      const size_t block = block_bytes(*dtype);
      int64_t differing_blocks = 0;
      for (size_t offset = 0; offset < data.size(); offset += block) {
        if (std::memcmp(requantized.data() + offset, data.data() + offset, block) != 0)
          ++differing_blocks;
      }
      EXPECT_EQ(differing_blocks, 0) << name << " " << info.name << " " << to_string(*dtype)
                                     << ": of " << data.size() / block << " blocks";
      ++tensors_requantized[*dtype];
    }
  }
  for (DType dtype : kSuperBlockTypes) {
    EXPECT_GT(tensors_checked[dtype], 0)
        << "no " << to_string(dtype) << " tensor in the golden files";
    std::printf(
        "%-7s %3d tensors dequantized (worst relative RMS error %.4f), %3d requantized "
        "bit-exactly\n",
        std::string(to_string(dtype)).c_str(), tensors_checked[dtype], worst_relative_rms[dtype],
        tensors_requantized[dtype]);
  }
}

// Q8_K activations: hand-checked values of ggml's rule (d = max / -127 for the value of largest
// magnitude, round half to even, clamp at 127, sums per 16).
TEST(SuperBlockQ8_K, QuantizesLikeGgml) {
  std::vector<float> x(kQKBlock, 0.0f);
  x[0] = -2.0f;   // largest magnitude, negative: d = 2/127, q = -127
  x[1] = 1.0f;    // 63.5 -> 64 (ties to even)
  x[2] = 0.5f;    // 31.75 -> 32
  x[17] = -1.0f;  // -63.5 -> -64
  BlockQ8_K q;
  quant::quantize_row_q8_k(x.data(), &q, kQKBlock);
  EXPECT_FLOAT_EQ(q.d, 2.0f / 127.0f);
  EXPECT_EQ(q.qs[0], -127);
  EXPECT_EQ(q.qs[1], 64);
  EXPECT_EQ(q.qs[2], 32);
  EXPECT_EQ(q.qs[17], -64);
  EXPECT_EQ(q.bsums[0], -127 + 64 + 32);
  EXPECT_EQ(q.bsums[1], -64);
  x[0] = 2.0f;  // positive maximum: d = -2/127, the signs flip
  quant::quantize_row_q8_k(x.data(), &q, kQKBlock);
  EXPECT_FLOAT_EQ(q.d, -2.0f / 127.0f);
  EXPECT_EQ(q.qs[0], -127);
  EXPECT_EQ(q.qs[1], -64);
}

// Every super-block type round-trips random floats through its quantizer with the error of its
// bit width.
TEST(SuperBlockQuantize, RoundTripError) {
  const std::vector<float> x = random_floats(4 * kQKBlock, 7);
  for (DType dtype : kSuperBlockTypes) {
    std::vector<uint8_t> bytes(row_bytes(dtype, static_cast<int64_t>(x.size())));
    quantize_row(dtype, x.data(), bytes.data(), static_cast<int64_t>(x.size()));
    std::vector<float> back(x.size());
    dequantize_row(dtype, bytes.data(), back.data(), static_cast<int64_t>(x.size()));
    double err2 = 0, ref2 = 0;
    for (size_t k = 0; k < x.size(); ++k) {
      err2 += (back[k] - x[k]) * (back[k] - x[k]);
      ref2 += x[k] * x[k];
    }
    EXPECT_LT(std::sqrt(err2 / ref2), max_relative_rms(dtype)) << to_string(dtype);
  }
}

// Edge rows: all zeros decode to zeros; a constant row and a row with one large outlier stay
// finite and close in the RMS sense (the outlier itself within 5%).
TEST(SuperBlockQuantize, ZerosConstantsAndOutliers) {
  std::vector<float> zeros(kQKBlock, 0.0f), constant(kQKBlock, 0.75f),
      outlier = random_floats(kQKBlock, 4);
  outlier[77] = 1000.0f;
  for (DType dtype : kSuperBlockTypes) {
    std::vector<uint8_t> bytes(row_bytes(dtype, kQKBlock));
    std::vector<float> back(kQKBlock);
    quantize_row(dtype, zeros.data(), bytes.data(), kQKBlock);
    dequantize_row(dtype, bytes.data(), back.data(), kQKBlock);
    for (float v : back) ASSERT_EQ(v, 0.0f) << to_string(dtype);
    for (const std::vector<float>* row : {&constant, &outlier}) {
      quantize_row(dtype, row->data(), bytes.data(), kQKBlock);
      dequantize_row(dtype, bytes.data(), back.data(), kQKBlock);
      double err2 = 0, ref2 = 0;
      for (int k = 0; k < kQKBlock; ++k) {
        ASSERT_TRUE(std::isfinite(back[k])) << to_string(dtype);
        err2 += (back[k] - (*row)[k]) * (back[k] - (*row)[k]);
        ref2 += (*row)[k] * (*row)[k];
      }
      EXPECT_LT(std::sqrt(err2 / ref2), max_relative_rms(dtype)) << to_string(dtype);
    }
    quantize_row(dtype, outlier.data(), bytes.data(), kQKBlock);
    dequantize_row(dtype, bytes.data(), back.data(), kQKBlock);
    EXPECT_NEAR(back[77], 1000.0f, 50.0f) << to_string(dtype);
  }
}

// Random bytes make valid blocks once the f16 scales are finite and small. fill >= 0: every
// other byte is `fill` (0xFF: the largest levels, scales and mins of every type).
std::vector<uint8_t> random_blocks(DType dtype, int64_t rows, int64_t cols, uint32_t seed,
                                   int fill = -1) {
  std::vector<uint8_t> bytes(row_bytes(dtype, cols) * static_cast<size_t>(rows));
  std::mt19937 rng(seed);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(fill >= 0 ? fill : rng());
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const size_t block = block_bytes(dtype);
  for (size_t offset = 0; offset < bytes.size(); offset += block) {
    uint8_t* p = bytes.data() + offset;
    const auto set_f16 = [&](size_t at) {
      const uint16_t h = f32_to_f16(scale(rng));
      std::memcpy(p + at, &h, 2);
    };
    switch (dtype) {
      case DType::kQ2_K:
        set_f16(offsetof(BlockQ2_K, d));
        set_f16(offsetof(BlockQ2_K, dmin));
        break;
      case DType::kQ3_K:
        set_f16(offsetof(BlockQ3_K, d));
        break;
      case DType::kQ4_K:
        set_f16(offsetof(BlockQ4_K, d));
        set_f16(offsetof(BlockQ4_K, dmin));
        break;
      case DType::kQ5_K:
        set_f16(offsetof(BlockQ5_K, d));
        set_f16(offsetof(BlockQ5_K, dmin));
        break;
      case DType::kQ6_K:
        set_f16(offsetof(BlockQ6_K, d));
        break;
      case DType::kIQ4_XS:
        set_f16(offsetof(BlockIQ4_XS, d));
        break;
      default:
        break;
    }
  }
  return bytes;
}

// sum over c of |x[i][c]| * (|d * scale * q| + |dmin * min|) with x as the kernel sees it
// (Q8_K): the scale of the float rounding a correct kernel may add to the exact integer sums.
std::vector<double> magnitudes(const MatrixView& w, const float* x, int64_t num_x) {
  const int64_t num_blocks = w.cols / kQKBlock;
  std::vector<BlockQ8_K> xq(num_blocks);
  std::vector<double> mags(static_cast<size_t>(num_x * w.rows));
  quant::SuperBlockInts ints;
  for (int64_t i = 0; i < num_x; ++i) {
    quant::quantize_row_q8_k(x + i * w.cols, xq.data(), w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      const auto* row = static_cast<const uint8_t*>(w.data) + r * row_bytes(w.dtype, w.cols);
      double sum = 0;
      for (int64_t b = 0; b < num_blocks; ++b) {
        quant::decode_super_block(w.dtype, row + b * block_bytes(w.dtype), &ints);
        for (int e = 0; e < kQKBlock; ++e) {
          const double w_abs =
              std::fabs(static_cast<double>(ints.d) * ints.scales[e / 16] * ints.q[e]) +
              std::fabs(static_cast<double>(ints.dmin) * ints.mins[e / 16]);
          sum += w_abs * std::fabs(static_cast<double>(xq[b].d) * xq[b].qs[e]);
        }
      }
      mags[i * w.rows + r] = sum;
    }
  }
  return mags;
}

class SuperBlockMatmul : public PerTargetTest {};

TEST_P(SuperBlockMatmul, MatchesReferenceOnRandomBlocks) {
  ThreadPool pool1(1), pool3(3);
  uint32_t seed = 1;
  for (DType dtype : kSuperBlockTypes) {
    for (int64_t cols : {256, 512, 1280}) {
      for (int64_t rows : {1, 5, 19, 67}) {
        std::vector<uint8_t> bytes = random_blocks(dtype, rows, cols, ++seed);
        const MatrixView w{dtype, bytes.data(), rows, cols};
        for (int64_t num_x : {1, 2, 3, 5, 17, 64}) {
          if (rows == 67 && cols == 1280 && num_x == 64) continue;  // the reference is slow
          ThreadPool& pool = (seed % 2) ? pool1 : pool3;
          expect_matmul_matches_ref(w, num_x, pool, ++seed, magnitudes, 2e-6);
        }
      }
    }
  }
}

// The K-quants and IQ4_XS with the packed copy (pack_for_matmul) attached: decode and prefill
// from 16-row groups on AVX-512 VNNI CPUs, ignored on other targets. Random block bytes (every
// level, 6-bit scale and min; the 0xFF fill: the largest), rows that cut a group, activation rows
// on both sides of the 6-row tile. Where the packing is used, the matrix's own bytes are zero
// blocks, so a result equal to the reference's can only come from the packed copy.
TEST_P(SuperBlockMatmul, PackedK_QuantsMatchReference) {
  uint32_t seed = 700;
  for (const auto& [dtype, packed_block] :
       {std::pair{DType::kQ2_K, size_t{1344}}, std::pair{DType::kQ3_K, size_t{1856}},
        std::pair{DType::kQ4_K, size_t{2368}}, std::pair{DType::kQ5_K, size_t{2880}},
        std::pair{DType::kQ6_K, size_t{3392}}, std::pair{DType::kIQ4_XS, size_t{2240}}}) {
    // Whole cache lines, so that every block's level vectors start on one (the tiles' loads).
    EXPECT_EQ(packed_block % 64, 0u) << to_string(dtype);
    for (int fill : {-1, 0xFF}) {
      for (int64_t cols : {256, 1280}) {
        for (int64_t rows : {1, 15, 16, 37}) {
          const std::vector<uint8_t> bytes = random_blocks(dtype, rows, cols, ++seed, fill);
          const MatrixView w{dtype, bytes.data(), rows, cols};
          SCOPED_TRACE(std::string(to_string(dtype)) + " fill=" + std::to_string(fill));
          expect_packed_matmul_matches_ref(w, (rows + 15) / 16 * (cols / 256) * packed_block,
                                           {1, 2, 5, 6, 7, 13}, seed, magnitudes, 2e-6);
        }
      }
    }
  }
}

// Activations whose Q8_K rounding is all ties (max -127 makes the scale exactly 1, the others are
// k + 0.5): the kernels' quantizer must round half to even like ggml's nearest_int, or every
// output moves by many times the tolerance.
TEST_P(SuperBlockMatmul, ActivationTiesRoundHalfToEven) {
  ThreadPool pool(2);
  const int64_t rows = 16, cols = 512;
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> level(-126, 125);
  for (int64_t num_x : {1, 4, 9}) {
    std::vector<float> x(num_x * cols);
    for (int64_t k = 0; k < num_x * cols; ++k) x[k] = k % 256 == 0 ? -127.0f : level(rng) + 0.5f;
    for (DType dtype : kSuperBlockTypes) {
      std::vector<uint8_t> bytes = random_blocks(dtype, rows, cols, 11);
      const MatrixView w{dtype, bytes.data(), rows, cols};
      std::vector<float> y(num_x * rows), y_ref(num_x * rows);
      matmul(w, x.data(), num_x, y.data(), pool);
      ref::matmul(w, x.data(), num_x, y_ref.data());
      const std::vector<double> mags = magnitudes(w, x.data(), num_x);
      for (int64_t k = 0; k < num_x * rows; ++k) {
        ASSERT_NEAR(y[k], y_ref[k], 2e-6 * mags[k]) << to_string(dtype) << " num_x=" << num_x;
      }
    }
  }
}

// Quantized real values (not random bytes) through the same comparison, and the result close to
// the float product: catches a kernel and reference that agree on a wrong decoding.
TEST_P(SuperBlockMatmul, CloseToFloatProduct) {
  ThreadPool pool(2);
  for (DType dtype : kSuperBlockTypes) {
    const int64_t rows = 9, cols = 768, num_x = 6;
    const TestMatrix w(dtype, rows, cols, 99);
    const std::vector<float> x = random_floats(num_x * cols, 5);
    std::vector<float> y(num_x * rows), w_row(cols);
    matmul(w.view, x.data(), num_x, y.data(), pool);
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(dtype, w.bytes.data() + r * row_bytes(dtype, cols), w_row.data(), cols);
      for (int64_t i = 0; i < num_x; ++i) {
        double exact = 0, mag = 0;
        for (int64_t c = 0; c < cols; ++c) {
          exact += static_cast<double>(w_row[c]) * x[i * cols + c];
          mag += std::fabs(static_cast<double>(w_row[c]) * x[i * cols + c]);
        }
        EXPECT_NEAR(y[i * rows + r], exact, 0.01 * mag)
            << to_string(dtype);  // Q8_K: ~0.4% per value
      }
    }
  }
}

// Decode shapes (one or two activation rows, the AVX-512 decode kernels), long rows and odd
// row counts, on random blocks and on the extremes of the integer ranges: every byte 0xFF or
// 0x00 (largest / smallest levels, scales and mins) against activations of +-127.
TEST_P(SuperBlockMatmul, DecodeMatchesReferenceAtExtremes) {
  ThreadPool pool1(1), pool2(2);
  uint32_t seed = 100;
  for (DType dtype : kSuperBlockTypes) {
    for (int fill : {-1, 0xFF, 0x00, 0x5A}) {
      for (int64_t rows : {3, 37}) {
        const int64_t cols = 4096;
        std::vector<uint8_t> bytes = random_blocks(dtype, rows, cols, ++seed, fill);
        const MatrixView w{dtype, bytes.data(), rows, cols};
        for (int64_t num_x : {1, 2}) {
          std::vector<float> x = random_floats(num_x * cols, ++seed);
          if (fill >= 0) {
            for (int64_t k = 0; k < num_x * cols; ++k) x[k] = (k / 3) % 2 ? 1.0f : -1.0f;
          }
          std::vector<float> y(num_x * rows + 1, 12345.0f), y_ref(num_x * rows);
          matmul(w, x.data(), num_x, y.data(), seed % 2 ? pool1 : pool2);
          ref::matmul(w, x.data(), num_x, y_ref.data());
          const std::vector<double> mags = magnitudes(w, x.data(), num_x);
          for (int64_t k = 0; k < num_x * rows; ++k) {
            ASSERT_NEAR(y[k], y_ref[k], 2e-6 * mags[k] + 1e-30)
                << to_string(dtype) << " fill=" << fill << " rows=" << rows << " num_x=" << num_x
                << " k=" << k;
          }
          EXPECT_EQ(y[num_x * rows], 12345.0f) << "wrote past the end";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, SuperBlockMatmul, ::testing::ValuesIn(available_targets()),
                         target_test_name);

}  // namespace
}  // namespace sieve::kernels
