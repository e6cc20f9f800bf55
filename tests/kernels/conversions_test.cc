// Scalar conversions and row (de)quantization against hand-computed ggml values.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/blocks.h"
#include "kernels/ops.h"
#include "kernels_test_util.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace sieve::kernels {
namespace {

bool is_f16_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0; }
bool is_bf16_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0; }

TEST(Conversions, F16RoundTripsAllHalfs) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = f16_to_f32(half);
    if (is_f16_nan(half)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_TRUE(is_f16_nan(f32_to_f16(f))) << std::hex << h;
      ASSERT_EQ(f32_to_f16(f) & 0x8000, half & 0x8000) << "sign of NaN " << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_f16(f), half) << std::hex << h << " -> " << f;
    }
  }
}

TEST(Conversions, F16KnownValues) {
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));     // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x03FF), std::ldexp(1023.0f, -24));  // largest subnormal
  EXPECT_EQ(f16_to_f32(0x0400), std::ldexp(1.0f, -14));     // smallest normal
  EXPECT_EQ(f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(f16_to_f32(0x8000)));

  // Round to nearest, ties to even.
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3C00);      // tie -> even (down)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3C02);  // tie -> even (up)
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3C01);
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);  // overflows to inf
  EXPECT_EQ(f32_to_f16(1e10f), 0x7C00);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 2^-24 -> 0
  EXPECT_EQ(f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // tie between 1 and 2 -> 2
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(f32_to_f16(0.1f), 0x2E66);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// F16C from CPUID leaf 1 (Clang 14's __builtin_cpu_supports does not know "f16c"); its
// instructions use the AVX state, which "avx" checks the OS saves.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __builtin_cpu_supports("avx") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) &&
         (ecx & bit_F16C) != 0;
}

__attribute__((target("f16c"))) uint16_t hardware_f32_to_f16(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

TEST(Conversions, F16MatchesF16CHardwareOnRandomFloats) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "no F16C";
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;  // hardware keeps the payload, ggml canonicalises
    ASSERT_EQ(f32_to_f16(f), hardware_f32_to_f16(f)) << f;
  }
}
#endif

TEST(Conversions, BF16RoundTripsAllValues) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float f = bf16_to_f32(half);
    ASSERT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    if (is_bf16_nan(half)) {
      ASSERT_TRUE(is_bf16_nan(f32_to_bf16(f))) << std::hex << h;
    } else {
      ASSERT_EQ(f32_to_bf16(f), half) << std::hex << h;
    }
  }
}

TEST(Conversions, BF16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even (down)
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // rounds to inf
  // A signalling NaN stays a NaN (forced quiet).
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F800001u)), 0x7FC0);
}

TEST(Conversions, DTypeFactsAndRowBytes) {
  EXPECT_EQ(to_string(DType::kQ4_0), "Q4_0");
  EXPECT_EQ(block_elems(DType::kF16), 1);
  EXPECT_EQ(block_elems(DType::kQ8_0), 32);
  EXPECT_EQ(block_bytes(DType::kBF16), 2u);
  EXPECT_EQ(block_bytes(DType::kQ8_0), 34u);
  EXPECT_EQ(block_bytes(DType::kQ4_0), 18u);
  EXPECT_EQ(row_bytes(DType::kF32, 4096), 16384u);
  EXPECT_EQ(row_bytes(DType::kF16, 7), 14u);
  EXPECT_EQ(row_bytes(DType::kBF16, 1), 2u);
  EXPECT_EQ(row_bytes(DType::kQ8_0, 4096), 4352u);
  EXPECT_EQ(row_bytes(DType::kQ4_0, 4096), 2304u);
  EXPECT_EQ(row_bytes(DType::kQ4_0, 32), 18u);
  EXPECT_EQ(row_bytes(DType::kF32, int64_t{1} << 32), size_t{1} << 34);  // no 32-bit overflow
}

TEST(Quantize, Q8_0HandComputedBlock) {
  // x = j - 16: amax 16, d = 16/127 (f16 0x3008 = 0.1259765625), id = 127/16 = 7.9375.
  float x[32];
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  BlockQ8_0 block;
  quantize_row(DType::kQ8_0, x, &block, 32);
  EXPECT_EQ(block.d, 0x3008);
  EXPECT_EQ(block.qs[0], -127);  // -16 * 7.9375
  EXPECT_EQ(block.qs[15], -8);   // -1 * 7.9375 = -7.9375
  EXPECT_EQ(block.qs[16], 0);
  EXPECT_EQ(block.qs[17], 8);    // 7.9375
  EXPECT_EQ(block.qs[18], 16);   // 15.875
  EXPECT_EQ(block.qs[24], 64);   // 63.5 rounds away from zero
  EXPECT_EQ(block.qs[8], -64);   // -63.5 rounds away from zero
  EXPECT_EQ(block.qs[31], 119);  // 119.0625

  float back[32];
  dequantize_row(DType::kQ8_0, &block, back, 32);
  EXPECT_EQ(back[0], -127 * 0.1259765625f);
  EXPECT_EQ(back[31], 119 * 0.1259765625f);
}

TEST(Quantize, Q8_0RoundsHalfAwayFromZeroAndHandlesZeros) {
  float x[32] = {127.0f, 2.5f, -2.5f, 0.49f, 3.5f, -126.5f};  // d = 1, id = 1
  BlockQ8_0 block;
  quantize_row(DType::kQ8_0, x, &block, 32);
  EXPECT_EQ(block.d, 0x3C00);
  EXPECT_EQ(block.qs[1], 3);
  EXPECT_EQ(block.qs[2], -3);
  EXPECT_EQ(block.qs[3], 0);
  EXPECT_EQ(block.qs[4], 4);
  EXPECT_EQ(block.qs[5], -127);

  const float zeros[32] = {};
  quantize_row(DType::kQ8_0, zeros, &block, 32);
  EXPECT_EQ(block.d, 0);
  for (int8_t q : block.qs) EXPECT_EQ(q, 0);
}

// A matmul's activations as ggml's x86 backend quantizes them: ties to even, and Q8_1's sum
// term from the unrounded scale.
TEST(Quantize, ActivationsRoundHalfToEvenWithQ8_1Sums) {
  float x[64] = {127.0f, 2.5f, -2.5f, 0.49f, 3.5f, -126.5f};  // block 0: d = 1, 127 / max = 1
  for (int j = 0; j < 32; ++j) x[32 + j] = 100.0f - 3.0f * static_cast<float>(j);  // block 1
  int8_t q[64];
  float d[2], s[2];
  quantize_activations_q8(x, 64, q, d, s);
  EXPECT_EQ(d[0], 1.0f);
  EXPECT_EQ(q[0], 127);
  EXPECT_EQ(q[1], 2);
  EXPECT_EQ(q[2], -2);
  EXPECT_EQ(q[3], 0);
  EXPECT_EQ(q[4], 4);
  EXPECT_EQ(q[5], -126);
  EXPECT_EQ(s[0], 5.0f);  // 127 + 2 - 2 + 4 - 126
  const float scale = 100.0f / 127.0f;
  EXPECT_EQ(d[1], f16_to_f32(f32_to_f16(scale)));
  int sum = 0;
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(q[32 + j], static_cast<int8_t>(std::nearbyint(x[32 + j] * (127.0f / 100.0f)))) << j;
    sum += q[32 + j];
  }
  EXPECT_EQ(s[1], f16_to_f32(f32_to_f16(scale * static_cast<float>(sum))));

  const float zeros[32] = {};
  quantize_activations_q8(zeros, 32, q, d, s);
  EXPECT_EQ(d[0], 0.0f);
  EXPECT_EQ(s[0], 0.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[j], 0);
}

TEST(Quantize, Q4_0HandComputedBlock) {
  // Largest magnitude -8 -> d = -8 / -8 = 1, id = 1, q = min(15, (int)(x + 8.5)).
  float x[32] = {};
  x[0] = -8.0f;  // q 0
  x[1] = 7.0f;   // q 15
  x[2] = 3.4f;   // 11.9 -> 11
  x[3] = -0.6f;  // 7.9 -> 7
  x[16] = 5.0f;  // q 13, high nibble of byte 0
  x[17] = 7.9f;  // 16.4 -> clamped to 15
  BlockQ4_0 block;
  quantize_row(DType::kQ4_0, x, &block, 32);
  EXPECT_EQ(block.d, 0x3C00);
  EXPECT_EQ(block.qs[0], 0xD0);
  EXPECT_EQ(block.qs[1], 0xFF);
  EXPECT_EQ(block.qs[2], 0x8B);  // x[18] = 0 -> 8
  EXPECT_EQ(block.qs[3], 0x87);

  float back[32];
  dequantize_row(DType::kQ4_0, &block, back, 32);
  EXPECT_EQ(back[0], -8.0f);
  EXPECT_EQ(back[1], 7.0f);
  EXPECT_EQ(back[2], 3.0f);
  EXPECT_EQ(back[16], 5.0f);
  EXPECT_EQ(back[17], 7.0f);

  // Largest magnitude positive: d = 8 / -8 = -1, so x = 8 maps to q = 0.
  float y[32] = {};
  y[5] = 8.0f;
  y[6] = -7.0f;  // 7 + 8.5 = 15.5 -> 15
  quantize_row(DType::kQ4_0, y, &block, 32);
  EXPECT_EQ(block.d, 0xBC00);
  EXPECT_EQ(block.qs[5] & 0xF, 0);
  EXPECT_EQ(block.qs[6] & 0xF, 15);
  EXPECT_EQ(block.qs[0], 0x88);
}

TEST(Quantize, RandomRowsRoundTripWithinHalfAStep) {
  const int64_t n = 32 * 50;
  const std::vector<float> x = random_floats(n, 3, -5.0f, 5.0f);
  for (DType dtype : {DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> q(row_bytes(dtype, n));
    std::vector<float> back(n);
    quantize_row(dtype, x.data(), q.data(), n);
    dequantize_row(dtype, q.data(), back.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      const uint16_t d_bits = dtype == DType::kQ8_0
                                  ? reinterpret_cast<const BlockQ8_0*>(q.data())[b].d
                                  : reinterpret_cast<const BlockQ4_0*>(q.data())[b].d;
      // Rounding of d to f16 moves the grid by up to 2^-11 relative, at most 127 or 8 steps.
      const float step = std::fabs(f16_to_f32(d_bits));
      const float slack = dtype == DType::kQ8_0 ? 0.5f * step + 127 * step * 1e-3f : 1.0f * step;
      for (int64_t j = b * 32; j < (b + 1) * 32; ++j) {
        ASSERT_LE(std::fabs(x[j] - back[j]), slack) << to_string(dtype) << " j=" << j;
      }
    }
  }
}

TEST(Quantize, FloatRowsMatchScalarConversions) {
  const std::vector<float> x = random_floats(37, 5, -100.0f, 100.0f);
  std::vector<uint16_t> h(37);
  std::vector<float> back(37);
  quantize_row(DType::kF16, x.data(), h.data(), 37);
  dequantize_row(DType::kF16, h.data(), back.data(), 37);
  for (int i = 0; i < 37; ++i) {
    EXPECT_EQ(h[i], f32_to_f16(x[i]));
    EXPECT_EQ(back[i], f16_to_f32(h[i]));
  }
  quantize_row(DType::kBF16, x.data(), h.data(), 37);
  dequantize_row(DType::kBF16, h.data(), back.data(), 37);
  for (int i = 0; i < 37; ++i) {
    EXPECT_EQ(h[i], f32_to_bf16(x[i]));
    EXPECT_EQ(back[i], bf16_to_f32(h[i]));
  }
  std::vector<float> copy(37);
  quantize_row(DType::kF32, x.data(), copy.data(), 37);
  EXPECT_EQ(copy, x);
}

}  // namespace
}  // namespace sieve::kernels
