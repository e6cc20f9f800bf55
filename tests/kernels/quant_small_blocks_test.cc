// Q4_1, Q5_0, Q5_1, IQ4_NL (ggml blocks of 32): hand-decoded blocks; the SIMD matmul against
// ref::matmul on every target (odd row counts, num_x 1..17, cols multiples of 32 but not of
// 256, arbitrary block bytes); and the layouts against llama.cpp's own files: every tensor of
// shared/golden/quant/base-TYPE.gguf (llama-quantize from base-F16.gguf) dequantizes close to
// the F16 original, and sieve's quantizer reproduces llama-quantize's bytes exactly.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "kernels/ops.h"
#include "kernels_test_util.h"
#include "shared_data.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

constexpr DType kSmallBlockTypes[] = {DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL};
constexpr uint16_t kF16One = 0x3C00, kF16MinusTwo = 0xC000, kF16Half = 0x3800;

bool has_min(DType dtype) { return dtype == DType::kQ4_1 || dtype == DType::kQ5_1; }

// ----------------------------------------------------------------------------- decoding

// Quants 0..31 written into a Q5 block's qs / qh as ggml lays them out.
void pack_five_bits(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t bits = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    bits |= static_cast<uint32_t>(q[j] >> 4) << j;
    bits |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
  }
  std::memcpy(qh, &bits, 4);
}

TEST(SmallBlocks, DequantizeHandBuiltBlocks) {
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = (j * 7 + 3) % 32;  // every value 0..31 once
  std::vector<float> out(32);

  // Q4_1: d = 1, m = -2: x = q - 2 with q the nibble.
  std::vector<uint8_t> q4_1(20);
  std::memcpy(&q4_1[0], &kF16One, 2);
  std::memcpy(&q4_1[2], &kF16MinusTwo, 2);
  for (int j = 0; j < 16; ++j)
    q4_1[4 + j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
  dequantize_row(DType::kQ4_1, q4_1.data(), out.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], (q[j] & 0xF) - 2.0f) << "Q4_1 j=" << j;

  // Q5_0: d = 0.5: x = (q - 16) / 2.
  std::vector<uint8_t> q5_0(22);
  std::memcpy(&q5_0[0], &kF16Half, 2);
  pack_five_bits(q, &q5_0[6], &q5_0[2]);
  dequantize_row(DType::kQ5_0, q5_0.data(), out.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], (q[j] - 16) * 0.5f) << "Q5_0 j=" << j;

  // Q5_1: d = 1, m = -2: x = q - 2.
  std::vector<uint8_t> q5_1(24);
  std::memcpy(&q5_1[0], &kF16One, 2);
  std::memcpy(&q5_1[2], &kF16MinusTwo, 2);
  pack_five_bits(q, &q5_1[8], &q5_1[4]);
  dequantize_row(DType::kQ5_1, q5_1.data(), out.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], q[j] - 2.0f) << "Q5_1 j=" << j;

  // IQ4_NL: d = 1: x = ggml's kvalues_iq4nl[nibble].
  constexpr int kLevels[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                               1,    13,   25,  38,  53,  69,  89,  113};
  std::vector<uint8_t> iq4_nl(18);
  std::memcpy(&iq4_nl[0], &kF16One, 2);
  for (int j = 0; j < 16; ++j)
    iq4_nl[2 + j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
  dequantize_row(DType::kIQ4_NL, iq4_nl.data(), out.data(), 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], kLevels[q[j] & 0xF]) << "IQ4_NL j=" << j;
}

// Quantize -> dequantize of random rows stays within each format's rounding step.
TEST(SmallBlocks, QuantizeRoundTripWithinOneStep) {
  const int64_t n = 32 * 40;
  const std::vector<float> x = random_floats(n, 7, -2.0f, 2.0f);
  for (DType dtype : kSmallBlockTypes) {
    std::vector<uint8_t> bytes(row_bytes(dtype, n));
    std::vector<float> back(n);
    quantize_row(dtype, x.data(), bytes.data(), n);
    dequantize_row(dtype, bytes.data(), back.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float lo = x[b * 32], hi = x[b * 32];
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
      }
      // Twice the largest error: affine Q4_1 / Q5_1 half a level of (max - min) / 15 or / 31;
      // Q5_0 up to a whole level d = amax / 16 (level 32 on the side opposite the extreme is
      // clamped to 31); IQ4_NL: its x^2-weighted least-squares scale may leave the extreme
      // values up to ~15% of amax off. Plus the f16 rounding of d and m.
      const float amax = std::max(std::fabs(lo), std::fabs(hi));
      const float step = dtype == DType::kQ4_1   ? (hi - lo) / 15
                         : dtype == DType::kQ5_1 ? (hi - lo) / 31
                         : dtype == DType::kQ5_0 ? amax / 8
                                                 : amax * 0.3f;
      for (int j = 0; j < 32; ++j) {
        const int64_t k = b * 32 + j;
        ASSERT_LE(std::fabs(back[k] - x[k]), 0.5f * step + 2e-3f * amax)
            << to_string(dtype) << " block " << b << " j " << j << " x " << x[k];
      }
    }
  }
}

// Degenerate blocks: all zeros decode to exact zeros; a constant block to its value (Q4_1 /
// Q5_1: d = 0 and m = the value in f16; Q5_0: the value is the extreme level -16 d exactly;
// IQ4_NL: the least-squares scale of one level).
TEST(SmallBlocks, ZeroAndConstantBlocks) {
  for (DType dtype : kSmallBlockTypes) {
    for (float value : {0.0f, 0.75f, -3.5f}) {
      const std::vector<float> x(64, value);
      std::vector<uint8_t> bytes(row_bytes(dtype, 64));
      std::vector<float> back(64);
      quantize_row(dtype, x.data(), bytes.data(), 64);
      dequantize_row(dtype, bytes.data(), back.data(), 64);
      for (int j = 0; j < 64; ++j) {
        if (value == 0.0f) {
          ASSERT_EQ(back[j], 0.0f) << to_string(dtype) << " j=" << j;
        } else {
          ASSERT_NEAR(back[j], value, std::fabs(value) * 1e-3f) << to_string(dtype) << " j=" << j;
        }
      }
    }
  }
}

// ----------------------------------------------------------------------------- matmul

// The scale of the rounding error a correct kernel may make: sum_c |w[r][c] * x_q8[i][c]|,
// plus sum over blocks of |m_w| * sum |x_q8| for types with a minimum (the kernels add d*q*x
// and m*x as separate sums, which may cancel).
std::vector<double> magnitudes(const MatrixView& w, const float* x, int64_t num_x) {
  std::vector<float> w_row(w.cols), x_row(w.cols);
  std::vector<uint8_t> x_q8(row_bytes(DType::kQ8_0, w.cols));
  std::vector<double> mags(static_cast<size_t>(num_x * w.rows));
  const size_t w_row_bytes = row_bytes(w.dtype, w.cols);
  for (int64_t i = 0; i < num_x; ++i) {
    quantize_row(DType::kQ8_0, x + i * w.cols, x_q8.data(), w.cols);
    dequantize_row(DType::kQ8_0, x_q8.data(), x_row.data(), w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      const uint8_t* row = static_cast<const uint8_t*>(w.data) + r * w_row_bytes;
      dequantize_row(w.dtype, row, w_row.data(), w.cols);
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) {
        double m = 0.0;
        if (has_min(w.dtype)) {
          uint16_t m_bits;
          std::memcpy(&m_bits, row + (c / 32) * block_bytes(w.dtype) + 2, 2);
          m = std::fabs(f16_to_f32(m_bits));
        }
        sum += (std::fabs(static_cast<double>(w_row[c])) + m) * std::fabs(x_row[c]);
      }
      mags[i * w.rows + r] = sum;
    }
  }
  return mags;
}

class SmallBlockMatmul : public PerTargetTest {};

TEST_P(SmallBlockMatmul, MatchesReferenceAnyShape) {
  constexpr int64_t kCols[] = {32, 96, 320};
  expect_matmul_matches_ref_any_shape(kSmallBlockTypes, kCols, 100, magnitudes);
}

// Rows longer than one prefill column slice (1024): the slices accumulate into y.
TEST_P(SmallBlockMatmul, MatchesReferenceAcrossColumnSlices) {
  ThreadPool pool(3);
  uint32_t seed = 500;
  for (DType dtype : kSmallBlockTypes) {
    const TestMatrix w(dtype, 37, 2080, ++seed);
    for (int64_t num_x : {1, 6}) expect_matmul_matches_ref(w.view, num_x, pool, ++seed, magnitudes);
  }
}

// rows x cols of `dtype` blocks of arbitrary bytes (every nibble and fifth bit), with scales and
// minimums of both signs in [-0.1, 0.1].
std::vector<uint8_t> raw_random_blocks(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<uint8_t> bytes(row_bytes(dtype, cols) * rows);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> scale(-0.1f, 0.1f);
  for (size_t offset = 0; offset < bytes.size(); offset += block_bytes(dtype)) {
    const uint16_t d = f32_to_f16(scale(rng)), m = f32_to_f16(scale(rng));
    std::memcpy(&bytes[offset], &d, 2);
    if (has_min(dtype)) std::memcpy(&bytes[offset + 2], &m, 2);
  }
  return bytes;
}

// Blocks of arbitrary bytes, not only what the quantizers produce: every nibble and fifth bit,
// scales and minimums of both signs.
TEST_P(SmallBlockMatmul, MatchesReferenceOnRawRandomBlocks) {
  ThreadPool pool(3);
  std::mt19937 rng(9);
  for (DType dtype : kSmallBlockTypes) {
    const int64_t rows = 37, cols = 288;
    const std::vector<uint8_t> bytes = raw_random_blocks(dtype, rows, cols, rng);
    const MatrixView w{dtype, bytes.data(), rows, cols};
    for (int64_t num_x : {1, 4, 7})
      expect_matmul_matches_ref(w, num_x, pool, 31 + num_x, magnitudes);
  }
}

// The prefill tiles of 16 weight rows (AVX-512 VNNI CPUs, from 4 activation rows; other targets
// run their usual kernels here): arbitrary block bytes of every type with 32-value blocks, row
// counts that cut a 16-row group (and a whole group), activation rows on both sides of the
// threshold and of the 8-row activation tile, 1 and 3 blocks, and 33 blocks (two column slices,
// the last one a single block).
TEST_P(SmallBlockMatmul, GroupTilesMatchReferenceOnRawRandomBlocks) {
  ThreadPool pool1(1), pool3(3);
  std::mt19937 rng(17);
  uint32_t seed = 900;
  for (DType dtype : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL}) {
    for (int64_t cols : {32, 96, 33 * 32}) {
      for (int64_t rows : {1, 15, 16, 37}) {
        const std::vector<uint8_t> bytes = raw_random_blocks(dtype, rows, cols, rng);
        const MatrixView w{dtype, bytes.data(), rows, cols};
        for (int64_t num_x : {3, 4, 5, 8, 9, 20}) {
          for (ThreadPool* pool : {&pool1, &pool3})
            expect_matmul_matches_ref(w, num_x, *pool, ++seed, magnitudes);
        }
      }
    }
  }
}

// The weights repacked by pack_for_matmul() (decode and prefill from 16-row groups, AVX-512
// VNNI CPUs; other targets ignore the packing): arbitrary block bytes of every type with
// 32-value blocks, rows that cut a group, 1 to 17 activation rows (both sides of the 8-row
// tile), 1 and 3 threads. Where the packing is used, the matrix's own bytes are replaced by
// zero blocks, so a result equal to the reference's can only come from the packed copy.
TEST_P(SmallBlockMatmul, PackedGroupsMatchReferenceOnRawRandomBlocks) {
  std::mt19937 rng(23);
  uint32_t seed = 1300;
  for (DType dtype : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL}) {
    for (int64_t cols : {32, 96, 33 * 32}) {
      for (int64_t rows : {1, 15, 16, 37}) {
        const std::vector<uint8_t> bytes = raw_random_blocks(dtype, rows, cols, rng);
        const MatrixView w{dtype, bytes.data(), rows, cols};
        expect_packed_matmul_matches_ref(w, (rows + 15) / 16 * 16 * row_bytes(dtype, cols),
                                         {1, 2, 3, 8, 9, 17}, seed, magnitudes, 1e-5);
      }
    }
  }
}

// Row offsets past 2 GiB (32-bit index arithmetic would wrap): a sparse anonymous mapping of
// zero pages (zero blocks: y = 0) whose last rows hold data; decode and prefill. On the best
// target only (the VNNI tiles where the CPU has them): each call reads 2 GiB of zero pages,
// and matmul_test's RowOffsetsBeyond2GiB covers QuantKernel's indexing on every target.
TEST(SmallBlocks, RowOffsetsBeyond2GiB) {
  ThreadPool pool(3);
  const DType dtype = DType::kQ5_1;  // the largest block: fewest rows
  const int64_t cols = 1 << 19;
  const size_t bytes_per_row = row_bytes(dtype, cols);
  const int64_t rows = static_cast<int64_t>((size_t{1} << 31) / bytes_per_row) + 3;
  const size_t total = bytes_per_row * rows;
  ASSERT_GT(total - 2 * bytes_per_row, size_t{1} << 31);  // the last 2 rows start past 2 GiB
  void* mem = mmap(nullptr, total, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(mem, MAP_FAILED) << "cannot map " << total << " bytes";
  // Transparent huge pages, where the kernel allows them: the reads then fault in the huge zero
  // page 1,024 times instead of 4 KiB pages 524,288 times (25x faster, the same bytes read).
  madvise(mem, total, MADV_HUGEPAGE);
  auto* base = static_cast<uint8_t*>(mem);
  const int64_t num_data_rows = 3;
  const TestMatrix tail(dtype, num_data_rows, cols, 77);
  std::memcpy(base + (rows - num_data_rows) * bytes_per_row, tail.bytes.data(),
              num_data_rows * bytes_per_row);
  const MatrixView w{dtype, base, rows, cols};
  for (int64_t num_x : {1, 2, 4}) {  // 4: the 16-row group tiles
    const std::vector<float> x = random_floats(num_x * cols, 78);
    std::vector<float> y(num_x * rows, 1.0f), y_tail(num_x * num_data_rows);
    matmul(w, x.data(), num_x, y.data(), pool);
    ref::matmul(tail.view, x.data(), num_x, y_tail.data());
    const std::vector<double> mags = magnitudes(tail.view, x.data(), num_x);
    for (int64_t i = 0; i < num_x; ++i) {
      for (int64_t r = 0; r < rows - num_data_rows; r += 97) ASSERT_EQ(y[i * rows + r], 0.0f) << r;
      for (int64_t r = 0; r < num_data_rows; ++r) {
        const int64_t k = i * num_data_rows + r;
        EXPECT_NEAR(y[i * rows + rows - num_data_rows + r], y_tail[k], 1e-5 * mags[k])
            << "num_x " << num_x << " row " << rows - num_data_rows + r;
      }
    }
  }
  munmap(mem, total);
}

INSTANTIATE_TEST_SUITE_P(Targets, SmallBlockMatmul, ::testing::ValuesIn(available_targets()),
                         target_test_name);

// ----------------------------------------------------------------------------- llama.cpp files

std::vector<float> f16_tensor_as_f32(const gguf::File& file, const gguf::TensorInfo& info) {
  const std::span<const uint8_t> data = file.tensor_data(info);
  std::vector<float> values(info.num_elements());
  for (size_t k = 0; k < values.size(); ++k) {
    uint16_t bits;
    std::memcpy(&bits, data.data() + 2 * k, 2);
    values[k] = f16_to_f32(bits);
  }
  return values;
}

struct GoldenFile {
  std::string type_name;  // llama-quantize's name: "Q4_1", ...
  DType dtype;
};

class LlamaCppFile : public ::testing::TestWithParam<GoldenFile> {};

// For every tensor golden.json lists as TYPE in base-TYPE.gguf: same shape as in base-F16.gguf;
// dequantized, within 4/5-bit quantization error of the F16 values (relative RMS < 0.1);
// matmul equal to ref::matmul; and quantized by sieve from the F16 values, byte for byte what
// llama-quantize wrote.
TEST_P(LlamaCppFile, MatchesLlamaQuantize) {
  const GoldenFile& golden = GetParam();
  const std::string dir = "golden/quant/";
  std::ifstream golden_json(testing::shared_path(dir + "golden.json"));
  const nlohmann::json entries = nlohmann::json::parse(golden_json);
  std::vector<std::string> names;
  for (const auto& entry : entries) {
    if (entry.at("type_or_arch") != golden.type_name) continue;
    for (const auto& [name, type] : entry.at("tensor_type_map").items()) {
      if (type == golden.type_name) names.push_back(name);
    }
  }
  ASSERT_GE(names.size(), 10u) << "golden.json lists too few " << golden.type_name << " tensors";

  const gguf::File base = gguf::File::open(testing::shared_path(dir + "base-F16.gguf"));
  const gguf::File quantized =
      gguf::File::open(testing::shared_path(dir + "base-" + golden.type_name + ".gguf"));
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const gguf::TensorInfo* info = quantized.find_tensor(name);
    const gguf::TensorInfo* original = base.find_tensor(name);
    ASSERT_NE(info, nullptr);
    ASSERT_NE(original, nullptr);
    ASSERT_EQ(gguf::to_string(info->type), golden.type_name);
    ASSERT_EQ(original->type, gguf::TensorType::kF16);
    ASSERT_EQ(info->shape, original->shape);
    const int64_t cols = static_cast<int64_t>(info->shape[0]);
    const int64_t n = static_cast<int64_t>(info->num_elements());
    const std::span<const uint8_t> bytes = quantized.tensor_data(*info);
    ASSERT_EQ(bytes.size(), row_bytes(golden.dtype, cols) * (n / cols));

    const std::vector<float> reference = f16_tensor_as_f32(base, *original);
    std::vector<float> decoded(n);
    dequantize_row(golden.dtype, bytes.data(), decoded.data(), n);
    double err2 = 0.0, ref2 = 0.0;
    for (int64_t k = 0; k < n; ++k) {
      err2 += (decoded[k] - reference[k]) * static_cast<double>(decoded[k] - reference[k]);
      ref2 += reference[k] * static_cast<double>(reference[k]);
    }
    const double relative_rms = std::sqrt(err2 / ref2);
    EXPECT_LT(relative_rms, 0.1) << "dequantized " << golden.type_name;
    EXPECT_GT(relative_rms, 0.001) << "suspiciously exact for " << golden.type_name;

    // The SIMD kernels (best target) on llama.cpp's bytes, decode and prefill shapes.
    ThreadPool pool(2);
    const MatrixView w{golden.dtype, bytes.data(), n / cols, cols};
    for (int64_t num_x : {1, 5})
      expect_matmul_matches_ref(w, num_x, pool, static_cast<uint32_t>(num_x), magnitudes);

    std::vector<uint8_t> ours(bytes.size());
    quantize_row(golden.dtype, reference.data(), ours.data(), n);
    const size_t block = block_bytes(golden.dtype);
    size_t num_different = 0, first_different = ours.size();
    for (size_t offset = 0; offset < ours.size(); offset += block) {
      if (std::memcmp(ours.data() + offset, bytes.data() + offset, block) != 0) {
        if (num_different++ == 0) first_different = offset / block;
      }
    }
    EXPECT_EQ(num_different, 0u) << "of " << ours.size() / block
                                 << " blocks differ from llama-quantize's, "
                                 << "the first is block " << first_different;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, LlamaCppFile,
    ::testing::Values(GoldenFile{"Q4_1", DType::kQ4_1}, GoldenFile{"Q5_0", DType::kQ5_0},
                      GoldenFile{"Q5_1", DType::kQ5_1}, GoldenFile{"IQ4_NL", DType::kIQ4_NL}),
    [](const ::testing::TestParamInfo<GoldenFile>& info) { return info.param.type_name; });

}  // namespace
}  // namespace sieve::kernels
