#pragma once
// Internal to src/kernels: the dense int8 micro-kernel of the super-block types' prefill on x86
// CPUs with AVX-512 VNNI (vpdpbusd), in its own translation unit for the reason given in
// matmul_vnni.h. The AVX3 target of cpu/matmul_super_blocks.cc decodes 16 weight rows x a
// column slice into the tile below once, then runs every activation row over it here.
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/ops.h"

namespace sieve::kernels::vnni {

// 16 weight rows x num_super_blocks * 256 columns, decoded. Per group of `group_cols` (16 or
// 32) columns g, the rows' values are scale[g][r] * (level - offset) - min[g][r] with
// unsigned levels (the offset is folded into the activation side, see below):
//   levels  [cols / 4][16 rows][4 columns] u8: one 64-byte vector holds 4 columns of all rows
//   scales  [cols / group_cols][16] f32
//   mins    [cols / group_cols][16] f32, or nullptr when the type has none
struct SuperBlockTile {
  const uint8_t* levels;
  const float* scales;
  const float* mins;
  int group_cols;
  int64_t num_super_blocks;
};

// Activation rows i < num_x in Q8_K, and per row and column group (over all columns):
//   offset_sums[i][g] = -offset * sum of the group's q_x   (the levels' offset, in integer)
//   neg_sums[i][g]    = -(sum of the group's q_x) as f32    (against mins)
struct SuperBlockActivations {
  const BlockQ8_K* x;  // [num_x][blocks_per_row]
  int64_t blocks_per_row;
  const int32_t* offset_sums;
  const float* neg_sums;
  int64_t groups_per_row;
};

// y[i * y_stride + r] (+)= the tile's rows r < num_rows against activation rows i < num_x, over
// the tile's columns, which start at super-block first_block of the activation rows.
void super_block_tile(const SuperBlockTile& tile, const SuperBlockActivations& x,
                      int64_t first_block, int64_t num_x, float* y, int64_t y_stride, int num_rows,
                      bool accumulate);

// Q2_K and Q3_K weights packed by pack_for_matmul() (cpu/pack.h): groups of 16 rows (the last one
// padded with zero rows); their levels' 2 low bits, per 64-column chunk j, for m = 0..3, row r:
// 4 bytes, byte b holding in bits 2f, 2f + 1 (f = 0..3) the column 64j + 32 (f / 2) + 4k + b with
// k = m + 4 (f % 2). Per group and super-block, chunks in ascending order of use (as Q6_K's
// below, for the hardware prefetchers), each starting with the scales of its four 16-column
// groups 4j .. 4j + 3 ([group][16 rows] bytes):
//   Q2_K, kPackedQ2_KBytes (the same as the rows' blocks): 16 f16 d, 16 f16 dmin (row order);
//     per chunk its scale | min << 4 bytes (as in the block), then its 2-bit levels (256 bytes).
//   Q3_K, kPackedQ3_KBytes (+5.5%): 16 f16 d, 32 bytes of padding (so chunks start on a cache
//     line); per chunk its i8 scales, the 2-bit fields of q + 4 (256 bytes), then for half = 0, 1,
//     row r: 4 bytes, bit k of byte b its high bit (bit 2) for column 64j + 32 half + 4k + b.
//     Levels q + 4 (0..7); the offset is folded into x.offset_sums.
inline constexpr int64_t kPackedQ2_KChunkBytes = 64 + 4 * 64;
inline constexpr int64_t kPackedQ2_KBytes = 64 + 4 * kPackedQ2_KChunkBytes;
inline constexpr int64_t kPackedQ3_KChunkBytes = 64 + 4 * 64 + 2 * 64;
inline constexpr int64_t kPackedQ3_KBytes = 64 + 4 * kPackedQ3_KChunkBytes;

// Q4_K weights packed by pack_for_matmul() (cpu/pack.h): groups of 16 rows (the last one padded
// with zero rows), and per group and super-block kPackedQ4_KBytes:
//   16 f16 d, 16 f16 dmin (row order); then for chunk j = 0..3 (64 columns, sub-blocks 2j and
//   2j + 1), kPackedQ4_KChunkBytes each:
//   - scales [2 sub-blocks][16 rows] u8, mins [2][16] u8;
//   - for k = 0..7, row r: 4 bytes, byte b holding the level of column 64j + 4k + b (low nibble,
//     sub-block 2j) and of column 64j + 32 + 4k + b (high nibble, sub-block 2j + 1)
// so one 64-byte load gives two vpdpbusd operands of 4 columns x 16 rows, and a tile reads the
// block in ascending address order (as Q6_K's below, for the hardware prefetchers). 2368 bytes
// where the 16 rows' blocks take 2304: the 6-bit scales and mins are stored as bytes (+2.8%).
inline constexpr int64_t kPackedQ4_KChunkBytes = 64 + 8 * 64;
inline constexpr int64_t kPackedQ4_KBytes = 64 + 4 * kPackedQ4_KChunkBytes;

// Q5_K packed the same way, each chunk's nibbles followed by their fifth bits as byte masks of
// the level vectors: for half = 0, 1 (columns 64j + 32 half + [0, 32)) and k = 0..7, 8 bytes
// whose bit 4r + b is the fifth bit of row r, column 64j + 32 half + 4k + b (byte 4r + b of level
// vector k). 2880 bytes where the rows' blocks take 2816 (+2.3%).
inline constexpr int64_t kPackedQ5_KChunkBytes = kPackedQ4_KChunkBytes + 2 * 64;
inline constexpr int64_t kPackedQ5_KBytes = 64 + 4 * kPackedQ5_KChunkBytes;

// Q6_K packed by pack_for_matmul(): groups of 16 rows, and per group and super-block
// kPackedQ6_KBytes (+1%: 32 bytes of padding after d, so that every vector starts on a cache
// line; without it every other block's loads each spanned two lines, and one thread's decode from
// L2 ran at 57 GFLOP/s):
//   16 f16 d (row order), padding; then for chunk j = 0..3 (64 columns), kPackedQ6_KChunkBytes
//   each, in the order a tile first reads them (vectors by Q6_KLowVector / Q6_KHighVector):
//   - the scales of its 16-column groups 4j .. 4j + 3: [group][16 rows] i8;
//   - the levels' low 4 bits as Q4_K's levels above (k = 0..7, row r, byte b: columns
//     c = 64j + 4k + b and c + 32);
//   - their high 2 bits, for h = 0..3, row r: 4 bytes, byte b holding those of columns c, c + 32,
//     c + 16 and c + 48 (c = 64j + 4h + b) in bits 0-1, 2-3, 4-5 and 6-7.
//   A tile reads low vector k with high vector k % 4, so they are interleaved (low 0, high 0, low
//   1, high 1, ..., high 3, low 4 .. 7): a block is read in ascending address order, which the
//   hardware prefetchers follow. With all scales ahead of the levels and the high vectors after
//   the low ones, a model's Q6_K decode read 65-72% of the adjacent bandwidth on Zen 4, and 83-91%
//   in this order (docs/performance.md, "Super-blocks in the order they are read").
// Levels are q + 32 (0..63); the offset is folded into x.offset_sums as in super_block_tile.
inline constexpr int64_t kPackedQ6_KChunkBytes = 64 + 8 * 64 + 4 * 64;
inline constexpr int64_t kPackedQ6_KLevels = 64;  // where chunk 0 starts
constexpr int Q6_KLowVector(int k) { return k < 4 ? 1 + 2 * k : 5 + k; }
constexpr int Q6_KHighVector(int h) { return 2 + 2 * h; }
inline constexpr int64_t kPackedQ6_KBytes = kPackedQ6_KLevels + 4 * kPackedQ6_KChunkBytes;

// IQ4_XS packed by pack_for_matmul(): groups of 16 rows, and per group and super-block
// kPackedIQ4_XSBytes: 16 f16 d (row order); scales [8 sub-blocks][16 rows] i8 (ls - 32); 32 bytes
// of padding (the levels start on a cache line, as Q6_K's); then from kPackedIQ4_XSLevels per
// sub-block s (32 columns) as the packed 32-value blocks (matmul_vnni_small_blocks.h): for
// k = 0..3, row r: the sub-block's qs[4k .. 4k + 3] (low nibbles columns 4k.., high 16 + 4k..),
// indices into kIQ4NLValues. 2240 bytes where the rows' blocks take 2176 (+2.9%).
inline constexpr int64_t kPackedIQ4_XSLevels = 32 + 8 * 16 + 32;
inline constexpr int64_t kPackedIQ4_XSBytes = kPackedIQ4_XSLevels + 8 * 256;

// The product from weights of `dtype` (Q2_K .. Q6_K, IQ4_XS) packed as above, any number of
// activation rows (x as for super_block_tile: the types with a level offset read offset_sums,
// those with mins neg_sums): per group, sub-block and activation row 8 vpdpbusd and one or two
// FMAs for the 16 rows; per super-block one FMA with d and the activation scale (and one with
// dmin). Rows [g_begin * 16, min(rows, g_end * 16)), y [num_x][rows].
void packed_super_block_groups(DType dtype, const uint8_t* packed, int64_t rows, int64_t cols,
                               const SuperBlockActivations& x, float* y, int64_t g_begin,
                               int64_t g_end, int64_t num_x);

}  // namespace sieve::kernels::vnni
