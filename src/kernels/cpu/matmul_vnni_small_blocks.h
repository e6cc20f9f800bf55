#pragma once
// Internal to src/kernels: decode and prefill tiles for 4- and 5-bit weight blocks of 32
// (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) against Q8_0 activations on x86 CPUs with AVX-512 VNNI
// (vnni::supported()). Plain intrinsics in their own translation unit, as cpu/matmul_vnni.cc.
#include <cstddef>
#include <cstdint>

namespace sieve::kernels::vnni {

enum class SmallBlockFormat : uint8_t { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kIQ4_NL };

// y[i * rows + r] = sum_c w[r][c] * x[i][c] for r in [r_begin, r_end), i < num_x, with the
// weights decoded to unsigned bytes u (Q4: nibble, Q5: 5 bits, IQ4_NL: level + 128) so that
// w = d_w * (u + offset) + m_w, offset = -8 / 0 / -16 / 0 / -128 and m_w = 0 without a minimum.
// x pre-quantized to Q8_0 (q int8 [num_x][cols], d f32 [num_x][cols / 32]) and, for Q4_1 /
// Q5_1, xsum f32 [num_x][cols / 32] = ggml's Q8_1 s per block (QuantizedActivations::s; else may be
// null). cols % 32 == 0. Exact int32 block dot products (vpdpbusd, u8 x s8), one f32 FMA per block.
struct SmallBlockProblem {
  SmallBlockFormat format;
  const uint8_t* w;  // rows * row_bytes
  size_t row_bytes;  // cols / 32 * block bytes
  int64_t rows, cols;
  const int8_t* xq;
  const float* xd;
  const float* xsum;
  float* y;
  // small_block_groups only, formats with an offset: offset * (the sum of each block's q)
  // int32 [num_x][cols / 32] (level_offset()).
  const int32_t* offset_sums = nullptr;
};
void small_block_rows(const SmallBlockProblem& p, int64_t r_begin, int64_t r_end, int64_t num_x);

// The offset above: u + level_offset(format) is the weight's integer value.
constexpr int level_offset(SmallBlockFormat format) {
  switch (format) {
    case SmallBlockFormat::kQ4_0:
      return -8;
    case SmallBlockFormat::kQ5_0:
      return -16;
    case SmallBlockFormat::kIQ4_NL:
      return -128;
    case SmallBlockFormat::kQ4_1:
    case SmallBlockFormat::kQ5_1:
      break;
  }
  return 0;
}

// The same product for prefill, in tasks of whole 16-row groups: rows [g_begin * 16,
// min(rows, g_end * 16)). Per group and column slice, the 16 rows' weights are decoded once into
// matmul_super_blocks_vnni.h's tile layout (4 columns of all 16 rows per 64 bytes, f32 scales
// and minimums per row and block); every activation row then runs over the tile: per block 8
// vpdpbusd against broadcast activation bytes, one conversion and one FMA for the 16 rows.
// Needs offset_sums where level_offset(format) != 0.
void small_block_groups(const SmallBlockProblem& p, int64_t g_begin, int64_t g_end, int64_t num_x);

// Weights packed by pack_for_matmul() (cpu/pack.h): groups of 16 rows (the last one padded with
// zero rows), and per group and 32-column block, packed_block_bytes(format) bytes, the same as the
// 16 rows' blocks:
//   16 f16 scales d (row order); with a minimum, 16 f16 minimums m; with fifth bits, the 16 rows'
//   4 qh bytes (row order); then for k = 0..3, for row r = 0..15: qs[4k .. 4k + 3] of row r
// so one 64-byte load holds, per int32 lane r, columns 4k .. 4k + 3 (low nibbles) and 16 + 4k ..
// 16 + 4k + 3 (high nibbles) of row r: two vpdpbusd operands against 4 broadcast activation
// bytes, with no transpose at run time.
constexpr bool packed_has_min(SmallBlockFormat format) {
  return format == SmallBlockFormat::kQ4_1 || format == SmallBlockFormat::kQ5_1;
}
constexpr bool packed_has_fifth_bits(SmallBlockFormat format) {
  return format == SmallBlockFormat::kQ5_0 || format == SmallBlockFormat::kQ5_1;
}
constexpr int64_t packed_fifth_offset(SmallBlockFormat format) {
  return 32 + (packed_has_min(format) ? 32 : 0);
}
constexpr int64_t packed_levels_offset(SmallBlockFormat format) {
  return packed_fifth_offset(format) + (packed_has_fifth_bits(format) ? 64 : 0);
}
constexpr int64_t packed_block_bytes(SmallBlockFormat format) {
  return packed_levels_offset(format) + 256;
}

// The product from such packed weights (p.w the packed bytes, p.row_bytes unused), any num_x:
// per group, block and activation row, 8 vpdpbusd (low then high nibbles of the 4 level
// vectors), one conversion and one FMA for the 16 rows (+ one for the minimum). Needs
// offset_sums where level_offset(format) != 0. Rows [g_begin * 16, min(rows, g_end * 16)).
void packed_small_block_groups(const SmallBlockProblem& p, int64_t g_begin, int64_t g_end,
                               int64_t num_x);

}  // namespace sieve::kernels::vnni
