// The super-block types' prefill micro-kernel with AVX-512 VNNI: see matmul_super_blocks_vnni.h.
//
// Per tile of 16 weight rows, kX activation rows and column group (16 or 32 columns): the group's
// group_cols / 4 level vectors are loaded once; per activation row, group_cols / 4 vpdpbusd of
// them against 4 broadcast activation bytes into an int32 lane per weight row (started at the
// offset correction), one conversion and one FMA with the rows' scales (and one FMA of the rows'
// mins with the group's activation sum); per super-block one FMA with the activation scale.
#include "kernels/cpu/matmul_super_blocks_vnni.h"

#include <algorithm>
#include <array>
#include <cassert>
#include <cstring>

#include "kernels/cpu/targets.h"
#include "kernels/cpu/vnni_common.h"

namespace sieve::kernels::vnni {

#if SIEVE_VNNI

namespace {

template <int kGroupCols, bool kMins, int kX>
SIEVE_VNNI_ATTR inline void Tile(const SuperBlockTile& t, const SuperBlockActivations& a,
                                 int64_t first_block, int64_t x0, float* y, int64_t y_stride,
                                 __mmask16 rows, bool accumulate) {
  constexpr int kVecs = kGroupCols / 4;
  constexpr int kGroups = kQKBlock / kGroupCols;
  __m512 acc[kX];
  for (int i = 0; i < kX; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < t.num_super_blocks; ++sb) {
    const int64_t block = first_block + sb;
    const BlockQ8_K* xb[kX];
    const int32_t* offsets[kX];
    const float* sums[kX];
    for (int i = 0; i < kX; ++i) {
      xb[i] = a.x + (x0 + i) * a.blocks_per_row + block;
      offsets[i] = a.offset_sums + (x0 + i) * a.groups_per_row + block * kGroups;
      sums[i] = a.neg_sums + (x0 + i) * a.groups_per_row + block * kGroups;
    }
    __m512 block_acc[kX];
    for (int i = 0; i < kX; ++i) block_acc[i] = _mm512_setzero_ps();
    for (int g = 0; g < kGroups; ++g) {
      const int64_t tile_group = sb * kGroups + g;
      const uint8_t* levels = t.levels + tile_group * kVecs * 64;
      __m512i w[kVecs];
      for (int k = 0; k < kVecs; ++k) w[k] = _mm512_load_si512(levels + 64 * k);
      const __m512 scale = _mm512_load_ps(t.scales + tile_group * 16);
      const __m512 min = kMins ? _mm512_load_ps(t.mins + tile_group * 16) : scale;
      for (int i = 0; i < kX; ++i) {
        const int8_t* xq = xb[i]->qs + g * kGroupCols;
        __m512i dot = _mm512_set1_epi32(offsets[i][g]);
        for (int k = 0; k < kVecs; ++k) dot = DpbusdBroadcast(dot, w[k], xq + 4 * k);
        block_acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, block_acc[i]);
        if constexpr (kMins) {
          block_acc[i] = _mm512_fmadd_ps(min, _mm512_set1_ps(sums[i][g]), block_acc[i]);
        }
      }
    }
    for (int i = 0; i < kX; ++i)
      acc[i] = _mm512_fmadd_ps(block_acc[i], _mm512_set1_ps(xb[i]->d), acc[i]);
  }
  for (int i = 0; i < kX; ++i) {
    float* out = y + (x0 + i) * y_stride;
    const __m512 value =
        accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(rows, out), acc[i]) : acc[i];
    _mm512_mask_storeu_ps(out, rows, value);
  }
}

// The last num_x_left < kX activation rows as one tile.
template <int kGroupCols, bool kMins, int kX>
SIEVE_VNNI_ATTR void Remainder(const SuperBlockTile& t, const SuperBlockActivations& a,
                               int64_t first_block, int64_t x0, int64_t num_x_left, float* y,
                               int64_t y_stride, __mmask16 rows, bool accumulate) {
  if constexpr (kX > 0) {
    if (num_x_left == kX) {
      Tile<kGroupCols, kMins, kX>(t, a, first_block, x0, y, y_stride, rows, accumulate);
    } else {
      Remainder<kGroupCols, kMins, kX - 1>(t, a, first_block, x0, num_x_left, y, y_stride, rows,
                                           accumulate);
    }
  }
}

template <int kGroupCols, bool kMins>
SIEVE_VNNI_ATTR void AllRows(const SuperBlockTile& t, const SuperBlockActivations& a,
                             int64_t first_block, int64_t num_x, float* y, int64_t y_stride,
                             __mmask16 rows, bool accumulate) {
  // kX accumulators + kX block accumulators + group_cols / 4 level vectors + scale, min and
  // temporaries in the 32 zmm. Measured on Zen 4 (Q4_K / Q6_K 4096x4096, 256 rows, one core):
  // 32-column groups 6 rows 416 GFLOP/s (5: 376, 7: 320, 8: 301 - spills), 16-column groups
  // 8 rows ~420 (6: 400, 10: 416, 12: 390).
  constexpr int kX = kGroupCols == 32 ? 6 : 8;
  int64_t x0 = 0;
  for (; x0 + kX <= num_x; x0 += kX)
    Tile<kGroupCols, kMins, kX>(t, a, first_block, x0, y, y_stride, rows, accumulate);
  Remainder<kGroupCols, kMins, kX - 1>(t, a, first_block, x0, num_x - x0, y, y_stride, rows,
                                       accumulate);
}

// The packed formats (layouts in matmul_super_blocks_vnni.h), as PackedTile reads them: per
// super-block, 8 sub-blocks of 32 columns, each 8 level vectors (Levels: w[k] columns 4k .. 4k + 3
// of the 16 rows, one int32 lane per row) and the rows' scales, per 32 columns (kGroupCols 32) or
// per 16 (Scale(2s), Scale(2s + 1): columns 0-15 are w[0..3], 16-31 w[4..7]).
SIEVE_VNNI_ATTR inline __m512 ExpandBytes(const uint8_t* bytes, bool is_signed) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bytes));
  return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v));
}

// The 16 rows' f16 d (or dmin) at `at` as f32.
SIEVE_VNNI_ATTR inline __m512 RowScales(const uint8_t* at) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(at)));
}

// Q4_K (kFifthBits: Q5_K): levels 0..15 (0..31), u8 scales and mins per 32 columns.
template <bool kFifthBits>
struct PackedQ4_KFormat {
  static constexpr int64_t kBytes = kFifthBits ? kPackedQ5_KBytes : kPackedQ4_KBytes;
  static constexpr int64_t kChunkBytes = kFifthBits ? kPackedQ5_KChunkBytes : kPackedQ4_KChunkBytes;
  static constexpr int kGroupCols = 32;
  static constexpr bool kMins = true, kOffset = false;
  const uint8_t* block;
  SIEVE_VNNI_ATTR void Levels(int s, __m512i (&w)[8]) const {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const uint8_t* levels = Chunk(s / 2) + 64;
    for (int k = 0; k < 8; ++k) {
      __m512i v = _mm512_loadu_si512(levels + 64 * k);
      if (s % 2 == 1) v = _mm512_srli_epi16(v, 4);
      w[k] = _mm512_and_si512(v, nibble);
    }
    if constexpr (kFifthBits) {  // w[k]'s byte mask of fifth bits, straight into a mask register
      const uint8_t* masks = levels + 8 * 64 + 64 * (s % 2);
      for (int k = 0; k < 8; ++k) {
        uint64_t bits;
        std::memcpy(&bits, masks + 8 * k, sizeof(bits));
        w[k] = _mm512_mask_add_epi8(w[k], _cvtu64_mask64(bits), w[k], _mm512_set1_epi8(0x10));
      }
    }
  }
  SIEVE_VNNI_ATTR __m512 D() const { return RowScales(block); }
  SIEVE_VNNI_ATTR __m512 DMin() const { return RowScales(block + 32); }
  SIEVE_VNNI_ATTR __m512 Scale(int s) const {
    return ExpandBytes(Chunk(s / 2) + 16 * (s % 2), false);
  }
  SIEVE_VNNI_ATTR __m512 Min(int s) const {
    return ExpandBytes(Chunk(s / 2) + 32 + 16 * (s % 2), false);
  }
  const uint8_t* Chunk(int j) const { return block + 64 + j * kChunkBytes; }
};

// Q6_K: levels q + 32 (0..63), i8 scales per 16 columns.
struct PackedQ6_KFormat {
  static constexpr int64_t kBytes = kPackedQ6_KBytes;
  static constexpr int kGroupCols = 16;
  static constexpr bool kMins = false, kOffset = true;
  const uint8_t* block;
  SIEVE_VNNI_ATTR void Levels(int s, __m512i (&w)[8]) const {
    const __m512i nibble = _mm512_set1_epi8(0x0F), high_bits = _mm512_set1_epi8(0x30);
    const uint8_t* chunk = Chunk(s / 2);
    const int half = s % 2;  // columns 64 (s / 2) + 32 half + [0, 32)
    for (int k = 0; k < 8; ++k) {
      __m512i v = _mm512_loadu_si512(chunk + 64 * Q6_KLowVector(k));
      if (half == 1) v = _mm512_srli_epi16(v, 4);
      // The pair of bits 2 half + 4 (k / 4) of high vector k % 4 to bits 4, 5 (16-bit shifts:
      // what crosses a byte is masked off).
      const int shift = 2 * half + 4 * (k / 4);
      __m512i h = _mm512_loadu_si512(chunk + 64 * Q6_KHighVector(k % 4));
      if (shift < 4) h = _mm512_slli_epi16(h, 4 - shift);
      if (shift > 4) h = _mm512_srli_epi16(h, shift - 4);
      w[k] = _mm512_or_si512(_mm512_and_si512(v, nibble), _mm512_and_si512(h, high_bits));
    }
  }
  SIEVE_VNNI_ATTR __m512 D() const { return RowScales(block); }
  SIEVE_VNNI_ATTR __m512 Scale(int g) const {
    return ExpandBytes(Chunk(g / 4) + 16 * (g % 4), true);
  }
  const uint8_t* Chunk(int j) const {
    return block + kPackedQ6_KLevels + j * kPackedQ6_KChunkBytes;
  }
};

// IQ4_XS: levels kIQ4NLValues + 128 (u8) by nibble, i8 scales (ls - 32) per 32 columns.
struct PackedIQ4_XSFormat {
  static constexpr int64_t kBytes = kPackedIQ4_XSBytes;
  static constexpr int kGroupCols = 32;
  static constexpr bool kMins = false, kOffset = true;
  const uint8_t* block;
  SIEVE_VNNI_ATTR void Levels(int s, __m512i (&w)[8]) const {
    alignas(16) static constexpr std::array<uint8_t, 16> kBiased = BiasedIQ4NLValues();
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kBiased.data())));
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const uint8_t* levels = block + kPackedIQ4_XSLevels + 256 * s;
    for (int k = 0; k < 4; ++k) {
      const __m512i v = _mm512_loadu_si512(levels + 64 * k);
      w[k] = _mm512_shuffle_epi8(table, _mm512_and_si512(v, nibble));
      w[4 + k] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble));
    }
  }
  SIEVE_VNNI_ATTR __m512 D() const { return RowScales(block); }
  SIEVE_VNNI_ATTR __m512 Scale(int s) const { return ExpandBytes(block + 32 + 16 * s, true); }
};

// The 2-bit fields of Q2_K / Q3_K's packed levels (4 vectors per 64-column chunk): byte b of row
// r's lane in vector k % 4 holds columns 64j + 32 half + 4k + b in bits 2f, 2f + 1, f = 2 half +
// k / 4. A field is used where it lies, without a shift, as level x 4^f (vpdpbusd is linear; the
// dot is scaled back with the group's scale, exactly: powers of two), while level x 4^f fits a
// byte: fields f > kMaxLog4 are shifted down to kMaxLog4. Shifts run on one port on Intel cores,
// with vpdpbusd. TwoBitLog4 is the power of 4 of level vector k of half `half`:
template <int kMaxLog4>
constexpr int TwoBitLog4(int half, int k) {
  return std::min(2 * half + k / 4, kMaxLog4);
}
template <int kMaxLog4>
SIEVE_VNNI_ATTR inline __m512i TwoBitLevels(const uint8_t* low, int half, int k) {
  const __m512i v = _mm512_loadu_si512(low + 64 * (k % 4));
  const int field = 2 * half + k / 4, log4 = TwoBitLog4<kMaxLog4>(half, k);
  // 16-bit shifts: what crosses a byte is masked off.
  const __m512i at = field > log4 ? _mm512_srli_epi16(v, 2 * (field - log4)) : v;
  return _mm512_and_si512(at, _mm512_set1_epi8(char(3 << (2 * log4))));
}

// Q2_K: levels 0..3, per 16 columns a byte of 4-bit scale (low) and min (high), as the blocks'.
struct PackedQ2_KFormat {
  static constexpr int64_t kBytes = kPackedQ2_KBytes;
  static constexpr int kGroupCols = 16;
  static constexpr bool kMins = true, kOffset = false;
  static constexpr int kMaxLog4 = 3;  // 3 x 4^3 < 256
  const uint8_t* block;
  // Level vectors k < 4 and k >= 4 of sub-block s (the two 16-column groups) are scaled by
  // 4^DotLog4(s, 0) and 4^DotLog4(s, 1).
  static constexpr int DotLog4(int s, int group) { return TwoBitLog4<kMaxLog4>(s % 2, 4 * group); }
  SIEVE_VNNI_ATTR void Levels(int s, __m512i (&w)[8]) const {
    const uint8_t* low = Chunk(s / 2) + 64;
    for (int k = 0; k < 8; ++k) w[k] = TwoBitLevels<kMaxLog4>(low, s % 2, k);
  }
  SIEVE_VNNI_ATTR __m512 D() const { return RowScales(block); }
  SIEVE_VNNI_ATTR __m512 DMin() const { return RowScales(block + 32); }
  SIEVE_VNNI_ATTR __m512 Scale(int g) const { return Nibble(g, 0); }
  SIEVE_VNNI_ATTR __m512 Min(int g) const { return Nibble(g, 4); }
  SIEVE_VNNI_ATTR __m512 Nibble(int g, int shift) const {
    const __m512i bytes = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(Chunk(g / 4) + 16 * (g % 4))));
    return _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_srli_epi32(bytes, shift), _mm512_set1_epi32(15)));
  }
  const uint8_t* Chunk(int j) const { return block + 64 + j * kPackedQ2_KChunkBytes; }
};

// Q3_K: levels q + 4 (0..7) from 2 low bits and a high bit, i8 scales per 16 columns.
struct PackedQ3_KFormat {
  static constexpr int64_t kBytes = kPackedQ3_KBytes;
  static constexpr int kGroupCols = 16;
  static constexpr bool kMins = false, kOffset = true;
  static constexpr int kMaxLog4 = 2;  // 7 x 4^2 < 256
  const uint8_t* block;
  static constexpr int DotLog4(int s, int group) { return TwoBitLog4<kMaxLog4>(s % 2, 4 * group); }
  SIEVE_VNNI_ATTR void Levels(int s, __m512i (&w)[8]) const {
    const uint8_t* low = Chunk(s / 2) + 64;
    const __m512i high = _mm512_loadu_si512(low + 4 * 64 + 64 * (s % 2));
    for (int k = 0; k < 8; ++k) {
      w[k] = TwoBitLevels<kMaxLog4>(low, s % 2, k);
      const __mmask64 set = _mm512_test_epi8_mask(high, _mm512_set1_epi8(char(1 << k)));
      const int log4 = TwoBitLog4<kMaxLog4>(s % 2, k);
      w[k] = _mm512_mask_add_epi8(w[k], set, w[k], _mm512_set1_epi8(char(4 << (2 * log4))));
    }
  }
  SIEVE_VNNI_ATTR __m512 D() const { return RowScales(block); }
  SIEVE_VNNI_ATTR __m512 Scale(int g) const {
    return ExpandBytes(Chunk(g / 4) + 16 * (g % 4), true);
  }
  const uint8_t* Chunk(int j) const { return block + 64 + j * kPackedQ3_KChunkBytes; }
};

// The power of 4 that F's level vectors of 16-column group `group` (0: k < 4, 1: k >= 4) of
// sub-block s carry (TwoBitLevels); 0 for the formats whose levels are not scaled.
template <class F>
constexpr int DotLog4(int s, int group) {
  if constexpr (requires { F::DotLog4(s, group); }) {
    return F::DotLog4(s, group);
  } else {
    return 0;
  }
}

// 16 packed rows (group at `group`) x activation rows [x0, x0 + kX), all super-blocks: the sums
// of super_block_tile's Tile<F::kGroupCols, F::kMins, kX>, with the levels and the f32 scales
// made in registers from the packed bytes.
template <class F, int kX>
SIEVE_VNNI_ATTR inline void PackedTile(const uint8_t* group, int64_t num_blocks,
                                       const SuperBlockActivations& a, int64_t x0, float* y,
                                       int64_t y_stride, __mmask16 rows, bool prefetch) {
  constexpr int kGroups = kQKBlock / F::kGroupCols;
  __m512 acc[kX];
  for (int i = 0; i < kX; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < num_blocks; ++sb) {
    const F f{group + sb * F::kBytes};
    const BlockQ8_K* xb[kX];
    const int32_t* offsets[kX];
    const float* sums[kX];
    for (int i = 0; i < kX; ++i) {
      xb[i] = a.x + (x0 + i) * a.blocks_per_row + sb;
      offsets[i] = a.offset_sums + (x0 + i) * a.groups_per_row + sb * kGroups;
      sums[i] = a.neg_sums + (x0 + i) * a.groups_per_row + sb * kGroups;
    }
    // Per super-block, as llama.cpp's dot products: the integer scales times the integer sums
    // (exact in f32: each |dot x scale| < 2^24), then one product with d and the activation scale
    // (the mins' sums likewise apart, with dmin), so the packed copies round as its kernels do.
    __m512 block_acc[kX], min_acc[kX];
    for (int i = 0; i < kX; ++i) block_acc[i] = min_acc[i] = _mm512_setzero_ps();
#pragma GCC unroll 8  // s % 2 becomes a constant
    for (int s = 0; s < 8; ++s) {
      if (prefetch) PrefetchPackedAhead<F::kBytes, 8>(f.block, s);
      __m512i w[8];
      f.Levels(s, w);
      constexpr bool kHalves = F::kGroupCols == 16;
      // Levels scaled by 4^log4: the offsets by as much, the group's scale by its inverse.
      const int log4_0 = DotLog4<F>(s, 0), log4_1 = DotLog4<F>(s, 1);
      const auto unscale = [](__m512 scale, int log4) SIEVE_VNNI_ATTR {
        return log4 == 0 ? scale : _mm512_mul_ps(scale, _mm512_set1_ps(1.0f / (1 << (2 * log4))));
      };
      const __m512 scale0 = unscale(f.Scale(kHalves ? 2 * s : s), log4_0);
      const __m512 scale1 = kHalves ? unscale(f.Scale(2 * s + 1), log4_1) : scale0;
      __m512 min0 = _mm512_setzero_ps(), min1 = _mm512_setzero_ps();
      if constexpr (F::kMins) {
        min0 = f.Min(kHalves ? 2 * s : s);
        if constexpr (kHalves) min1 = f.Min(2 * s + 1);
      }
#pragma GCC unroll 8  // keeps the accumulators in registers
      for (int i = 0; i < kX; ++i) {
        const int8_t* xq = xb[i]->qs + 32 * s;
        // Two chains of 4 (columns 0-15 and 16-31), so one activation row (decode) is not bound
        // by one chain's latency; they start at the level offset's correction.
        __m512i dot0 = _mm512_setzero_si512(), dot1 = _mm512_setzero_si512();
        if constexpr (F::kOffset) {
          dot0 = _mm512_set1_epi32(offsets[i][kHalves ? 2 * s : s] * (1 << (2 * log4_0)));
          if constexpr (kHalves)
            dot1 = _mm512_set1_epi32(offsets[i][2 * s + 1] * (1 << (2 * log4_1)));
        }
        for (int k = 0; k < 4; ++k) {
          dot0 = DpbusdBroadcast(dot0, w[k], xq + 4 * k);
          dot1 = DpbusdBroadcast(dot1, w[4 + k], xq + 16 + 4 * k);
        }
        if constexpr (kHalves) {
          block_acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot0), scale0, block_acc[i]);
          block_acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot1), scale1, block_acc[i]);
        } else {
          block_acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(dot0, dot1)), scale0,
                                         block_acc[i]);
        }
        if constexpr (F::kMins) {
          min_acc[i] =
              _mm512_fmadd_ps(min0, _mm512_set1_ps(sums[i][kHalves ? 2 * s : s]), min_acc[i]);
          if constexpr (kHalves)
            min_acc[i] = _mm512_fmadd_ps(min1, _mm512_set1_ps(sums[i][2 * s + 1]), min_acc[i]);
        }
      }
    }
    const __m512 d = f.D();
    for (int i = 0; i < kX; ++i) {
      const __m512 xd = _mm512_set1_ps(xb[i]->d);
      acc[i] = _mm512_fmadd_ps(block_acc[i], _mm512_mul_ps(d, xd), acc[i]);
      if constexpr (F::kMins)
        acc[i] = _mm512_fmadd_ps(min_acc[i], _mm512_mul_ps(f.DMin(), xd), acc[i]);
    }
  }
  for (int i = 0; i < kX; ++i) _mm512_mask_storeu_ps(y + (x0 + i) * y_stride, rows, acc[i]);
}

// The last num_x_left < kX activation rows of a packed group as one PackedTile<F, kX'>.
template <class F, int kX>
SIEVE_VNNI_ATTR void PackedRemainder(const uint8_t* group, int64_t num_blocks,
                                     const SuperBlockActivations& a, int64_t x0, int64_t num_x_left,
                                     float* y, int64_t y_stride, __mmask16 rows, bool prefetch) {
  if constexpr (kX > 0) {
    if (num_x_left == kX)
      return PackedTile<F, kX>(group, num_blocks, a, x0, y, y_stride, rows, prefetch);
    PackedRemainder<F, kX - 1>(group, num_blocks, a, x0, num_x_left, y, y_stride, rows, prefetch);
  }
}

// Groups [g_begin, g_end) of packed weights, 6 activation rows at a time (6 accumulators + 6
// block sums + 8 level vectors, as AllRows<32, true>).
template <class F>
SIEVE_VNNI_ATTR void PackedGroups(const uint8_t* packed, int64_t rows, int64_t cols,
                                  const SuperBlockActivations& x, float* y, int64_t g_begin,
                                  int64_t g_end, int64_t num_x) {
  constexpr int kX = 6;
  const int64_t num_blocks = cols / kQKBlock;
  const bool prefetch = packed_block_prefetch();
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t r0 = g * 16;
    const __mmask16 mask =
        rows - r0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (rows - r0)) - 1);
    const uint8_t* group = packed + g * num_blocks * F::kBytes;
    int64_t x0 = 0;
    for (; x0 + kX <= num_x; x0 += kX)
      PackedTile<F, kX>(group, num_blocks, x, x0, y + r0, rows, mask, prefetch);
    PackedRemainder<F, kX - 1>(group, num_blocks, x, x0, num_x - x0, y + r0, rows, mask, prefetch);
  }
}

}  // namespace

SIEVE_VNNI_ATTR void super_block_tile(const SuperBlockTile& tile, const SuperBlockActivations& x,
                                      int64_t first_block, int64_t num_x, float* y,
                                      int64_t y_stride, int num_rows, bool accumulate) {
  const __mmask16 rows = num_rows >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << num_rows) - 1);
  const bool mins = tile.mins != nullptr;
  if (tile.group_cols == 32) {
    if (mins) return AllRows<32, true>(tile, x, first_block, num_x, y, y_stride, rows, accumulate);
    return AllRows<32, false>(tile, x, first_block, num_x, y, y_stride, rows, accumulate);
  }
  if (mins) return AllRows<16, true>(tile, x, first_block, num_x, y, y_stride, rows, accumulate);
  return AllRows<16, false>(tile, x, first_block, num_x, y, y_stride, rows, accumulate);
}

SIEVE_VNNI_ATTR void packed_super_block_groups(DType dtype, const uint8_t* packed, int64_t rows,
                                               int64_t cols, const SuperBlockActivations& x,
                                               float* y, int64_t g_begin, int64_t g_end,
                                               int64_t num_x) {
  const auto run = [&]<class Format>(Format*) SIEVE_VNNI_ATTR {
    PackedGroups<Format>(packed, rows, cols, x, y, g_begin, g_end, num_x);
  };
  switch (dtype) {
    case DType::kQ2_K:
      return run(static_cast<PackedQ2_KFormat*>(nullptr));
    case DType::kQ3_K:
      return run(static_cast<PackedQ3_KFormat*>(nullptr));
    case DType::kQ4_K:
      return run(static_cast<PackedQ4_KFormat<false>*>(nullptr));
    case DType::kQ5_K:
      return run(static_cast<PackedQ4_KFormat<true>*>(nullptr));
    case DType::kQ6_K:
      return run(static_cast<PackedQ6_KFormat*>(nullptr));
    case DType::kIQ4_XS:
      return run(static_cast<PackedIQ4_XSFormat*>(nullptr));
    default:
      assert(false && "not a packed super-block type");
  }
}

#else

void super_block_tile(const SuperBlockTile&, const SuperBlockActivations&, int64_t, int64_t, float*,
                      int64_t, int, bool) {}
void packed_super_block_groups(DType, const uint8_t*, int64_t, int64_t,
                               const SuperBlockActivations&, float*, int64_t, int64_t, int64_t) {}

#endif

}  // namespace sieve::kernels::vnni
