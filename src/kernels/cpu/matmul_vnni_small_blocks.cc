// Prefill tiles for Q4_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL weights with AVX-512 VNNI: see
// matmul_vnni_small_blocks.h; the portable kernels are matmul-inl.h's QuantKernel, the scalar
// reference ref/ref_small_blocks.cc and ref/ref_ops.cc.
//
// vpdpbusd multiplies unsigned by signed bytes: the weights decode to unsigned u (at most 5
// bits; IQ4_NL's signed levels + 128 from a biased table), the activations stay signed. Each
// int32 lane starts at offset * (the sum of its 4 activations), one vpdpbusd per activation
// vector, so it ends with its exact share of sum_j (u_j + offset) x_j: small numbers, nothing
// lost to cancellation in the float conversion and the sum over lanes (as the portable
// kernels). One 512-bit vector holds two blocks
// (int32 lanes 0-7 block b, 8-15 block b + 1), decoded from the two blocks' 16-byte qs as
//   [qs_b, qs_b, qs_b1, qs_b1] (128-bit lanes) >> [0, 4, 0, 4] & 0xF
// which puts columns 0-15 (low nibbles) then 16-31 (high nibbles) of each block in order.
//
// small_block_rows, per block pair: one weight decode per weight row, one activation load (+
// offset vpdpbusd) per activation row, and per (weight row, activation row) vpdpbusd, convert,
// scale, FMA (+ one FMA for the minimum). Decode: whole rows, 4 at a time, with a streaming
// prefetch cursor. Prefill of 2-3 rows: loop order as cpu/matmul_vnni.cc, column slices, weight
// tiles (prefetched one ahead, decoded once into an L1 buffer), then activation tiles over it.
//
// small_block_groups (prefill from 4 rows): the same decode, transposed so that one vector holds
// 4 columns of 16 weight rows; per block and activation row 8 vpdpbusd against broadcast
// activation bytes and one convert, scale, FMA for all 16 rows: 11 vector ops per 512 products
// where the tiles above need 32 (measured 1.9x at 64 rows, 4096x4096 Q4_0, one thread).
//
// packed_small_block_groups (weights repacked at load by pack_for_matmul(); decode and
// prefill): the same group tiles read straight from the packed copy, nibbles unpacked in
// registers (and, shift, and), no transpose; per block of 16 rows decode takes ~25 vector ops
// where small_block_rows takes ~80 (Q4_0 decode of the 2048-dim model, one thread: 58-60% ->
// 77-87% of the read bandwidth).
#include "kernels/cpu/matmul_vnni_small_blocks.h"

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/cpu/targets.h"
#include "kernels/cpu/vnni_common.h"

namespace sieve::kernels::vnni {

#if SIEVE_VNNI

namespace {

inline constexpr int kRowsW = 4;
inline constexpr int kRowsX = 4;
inline constexpr int64_t kSliceBlocks = 32;  // 1024 columns: 4 activation rows = 4 KiB in L1

// What each format needs from its block struct; every block starts with its f16 d. u + kOffset
// is the weight's integer value.
template <SmallBlockFormat kFormat>
struct Format;
template <>
struct Format<SmallBlockFormat::kQ4_0> {
  using Block = BlockQ4_0;
  static constexpr bool kFifthBits = false, kMin = false, kTable = false;
  static constexpr int kOffset = level_offset(SmallBlockFormat::kQ4_0);
};
template <>
struct Format<SmallBlockFormat::kQ4_1> {
  using Block = BlockQ4_1;
  static constexpr bool kFifthBits = false, kMin = true, kTable = false;
  static constexpr int kOffset = level_offset(SmallBlockFormat::kQ4_1);
};
template <>
struct Format<SmallBlockFormat::kQ5_0> {
  using Block = BlockQ5_0;
  static constexpr bool kFifthBits = true, kMin = false, kTable = false;
  static constexpr int kOffset = level_offset(SmallBlockFormat::kQ5_0);
};
template <>
struct Format<SmallBlockFormat::kQ5_1> {
  using Block = BlockQ5_1;
  static constexpr bool kFifthBits = true, kMin = true, kTable = false;
  static constexpr int kOffset = level_offset(SmallBlockFormat::kQ5_1);
};
template <>
struct Format<SmallBlockFormat::kIQ4_NL> {
  using Block = BlockIQ4_NL;
  static constexpr bool kFifthBits = false, kMin = false, kTable = true;
  static constexpr int kOffset = level_offset(SmallBlockFormat::kIQ4_NL);
};

// {v[lane0] x 8, v[lane1] x 8} from the f32 lanes of v.
SIEVE_VNNI_ATTR inline __m512 Spread(__m128 v, int lane0, int lane1) {
  const __m512i index = _mm512_mask_set1_epi32(_mm512_set1_epi32(lane0), 0xFF00, lane1);
  return _mm512_permutexvar_ps(index, _mm512_castps128_ps512(v));
}

SIEVE_VNNI_ATTR inline uint32_t LoadU32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// The weights of blocks b (and b + 1 if `pair`) as unsigned bytes; the f16 scales of the two
// blocks as {d_b, d_b1} in 16-bit fields, with a minimum {d_b, m_b, d_b1, m_b1} (the blocks'
// first 4 bytes).
template <SmallBlockFormat kFormat>
struct DecodedPair {
  __m512i u;
  uint64_t scales;
};

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR inline DecodedPair<kFormat> Decode(const typename Format<kFormat>::Block* block,
                                                   bool pair) {
  using F = Format<kFormat>;
  const __m512i shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
  const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block[0].qs));
  __m512i z;
  DecodedPair<kFormat> out;
  constexpr int kScaleBits = F::kMin ? 32 : 16;
  out.scales = F::kMin ? LoadU32(&block[0]) : block[0].d;
  uint64_t fifth = 0;
  if constexpr (F::kFifthBits) fifth = LoadU32(block[0].qh);
  if (pair) {
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block[1].qs));
    z = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(q0), 0xFF00, q1);
    out.scales |= static_cast<uint64_t>(F::kMin ? LoadU32(&block[1]) : block[1].d) << kScaleBits;
    if constexpr (F::kFifthBits) fifth |= static_cast<uint64_t>(LoadU32(block[1].qh)) << 32;
  } else {
    z = _mm512_maskz_broadcast_i32x4(0x00FF, q0);
  }
  // Without a pair the upper block decodes to zeros (IQ4_NL: to level 0 + 128), against
  // zero activations (so zero offsets) and zero scales: it adds nothing.
  __m512i u = _mm512_and_si512(_mm512_srlv_epi64(z, shifts), _mm512_set1_epi8(0xF));
  if constexpr (F::kFifthBits) u = _mm512_mask_add_epi8(u, fifth, u, _mm512_set1_epi8(0x10));
  if constexpr (F::kTable) {
    alignas(16) static constexpr std::array<uint8_t, 16> kBiased = BiasedIQ4NLValues();
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kBiased.data())));
    u = _mm512_shuffle_epi8(table, u);
  }
  out.u = u;
  return out;
}

// Decode streams whole rows; a tile's kW rows are adjacent, and so are consecutive tiles. For
// rows shorter than kStreamMaxRowBytes a cursor prefetches that region linearly kStreamAhead
// bytes ahead of the reads, at the rate the tile consumes it (as matmul-inl.h's RowPrefetcher:
// the hardware prefetchers do not ramp up on rows of a few KiB). Unlike there, rows of 8-11
// KiB (Q4_1/Q5_x at 11008 or 14336 columns) still gain 1.2-1.4x here, measured single-threaded
// on the Zen 4 VM; longer rows (untried) are left to the hardware, as the cursor falls behind
// the tile's later rows.
inline constexpr uintptr_t kStreamAhead = 16 << 10;
inline constexpr size_t kStreamMaxRowBytes = 16 << 10;

// One block pair of a weight row, ready for the products: unsigned weights, scales {d_b x 8,
// d_b1 x 8} and (kMin) minimums spread the same way.
template <SmallBlockFormat kFormat>
struct WeightPair {
  __m512i u;
  __m512 d, m;
};

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR inline WeightPair<kFormat> PrepareWeights(
    const typename Format<kFormat>::Block* block, bool pair) {
  const DecodedPair<kFormat> decoded = Decode<kFormat>(block, pair);
  const __m128 scales = _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<int64_t>(decoded.scales)));
  WeightPair<kFormat> out;
  out.u = decoded.u;
  if constexpr (Format<kFormat>::kMin) {
    out.d = Spread(scales, 0, 2);
    out.m = Spread(scales, 1, 3);
  } else {
    out.d = Spread(scales, 0, 1);
    out.m = _mm512_setzero_ps();
  }
  return out;
}

// One block pair of an activation row: the quants, each int32 lane's offset correction, the
// scales spread as the weights', and (kMin) each block's d_x * sum(q_x) / 8 per lane (exact).
struct ActivationPair {
  __m512i q, offset;
  __m512 d, sum;
};

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR inline ActivationPair PrepareActivations(const SmallBlockProblem& p, int64_t xb,
                                                         bool pair) {
  using F = Format<kFormat>;
  const int8_t* q = p.xq + xb * kQBlock;
  ActivationPair out;
  if (pair) {
    out.q = _mm512_loadu_si512(q);
    out.d = SpreadPair(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p.xd + xb))));
  } else {
    out.q = _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    out.d = SpreadPair(_mm_load_ss(p.xd + xb));
  }
  out.offset = _mm512_setzero_si512();
  if constexpr (F::kOffset != 0) {
    const __m512i minus_offset = _mm512_set1_epi8(static_cast<char>(-F::kOffset));
    out.offset = _mm512_sub_epi32(out.offset, _mm512_dpbusd_epi32(out.offset, minus_offset, out.q));
  }
  out.sum = _mm512_setzero_ps();
  if constexpr (F::kMin) {
    const __m128 sums =
        pair ? _mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(p.xsum + xb)))
             : _mm_load_ss(p.xsum + xb);
    out.sum = _mm512_mul_ps(SpreadPair(sums), _mm512_set1_ps(0.125f));
  }
  return out;
}

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR inline __m512 Accumulate(const WeightPair<kFormat>& w, const ActivationPair& x,
                                         __m512 acc) {
  const __m512i dot = _mm512_dpbusd_epi32(x.offset, w.u, x.q);
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(w.d, x.d), acc);
  if constexpr (Format<kFormat>::kMin) acc = _mm512_fmadd_ps(w.m, x.sum, acc);
  return acc;
}

template <int kW, int kX>
SIEVE_VNNI_ATTR inline void StoreTile(const SmallBlockProblem& p, int64_t r0, int64_t x0,
                                      const Slice& s, __m512 (&acc)[kW][kX]) {
  for (int r = 0; r < kW; ++r) {
    for (int i = 0; i < kX; ++i) {
      float* out = &p.y[(x0 + i) * p.rows + r0 + r];
      const float value = _mm512_reduce_add_ps(acc[r][i]);
      *out = s.accumulate ? *out + value : value;
    }
  }
}

// Decode: weight rows [r0, r0 + kW) against activation row 0, decoding as it goes.
template <SmallBlockFormat kFormat, int kW>
SIEVE_VNNI_ATTR inline void DecodeTile(const SmallBlockProblem& p, int64_t r0, const Slice& s,
                                       bool stream) {
  using Block = typename Format<kFormat>::Block;
  const Block* w[kW];
  for (int r = 0; r < kW; ++r) w[r] = reinterpret_cast<const Block*>(p.w + (r0 + r) * p.row_bytes);
  __m512 acc[kW][1];
  for (int r = 0; r < kW; ++r) acc[r][0] = _mm512_setzero_ps();
  const uintptr_t stream_base = reinterpret_cast<uintptr_t>(w[0] + s.begin) + kStreamAhead;
  uintptr_t stream_next = stream_base;
  for (int64_t b = s.begin; b < s.end; b += 2) {
    const bool pair = b + 1 < s.end;
    if (stream) {
      const uintptr_t end =
          stream_base + static_cast<uintptr_t>(b - s.begin + 2) * kW * sizeof(Block);
      for (; stream_next < end; stream_next += 64)
        _mm_prefetch(reinterpret_cast<const char*>(stream_next), _MM_HINT_T0);
    }
    const ActivationPair x = PrepareActivations<kFormat>(p, b, pair);
    for (int r = 0; r < kW; ++r)
      acc[r][0] = Accumulate<kFormat>(PrepareWeights<kFormat>(w[r] + b, pair), x, acc[r][0]);
  }
  StoreTile<kW, 1>(p, r0, 0, s, acc);
}

// Prefill: a weight tile's slice decoded once for all the activation tiles that pass over it,
// kW * 16 * 192 bytes (L1).
template <SmallBlockFormat kFormat, int kW>
struct DecodedSlice {
  WeightPair<kFormat> pairs[kW][kSliceBlocks / 2];

  SIEVE_VNNI_ATTR void Fill(const SmallBlockProblem& p, int64_t r0, const Slice& s) {
    using Block = typename Format<kFormat>::Block;
    for (int r = 0; r < kW; ++r) {
      const Block* w = reinterpret_cast<const Block*>(p.w + (r0 + r) * p.row_bytes);
      for (int64_t b = s.begin; b < s.end; b += 2)
        pairs[r][(b - s.begin) / 2] = PrepareWeights<kFormat>(w + b, b + 1 < s.end);
    }
  }
};

// Prefill: the decoded weight rows [r0, r0 + kW) x activation rows [x0, x0 + kX).
template <SmallBlockFormat kFormat, int kW, int kX>
SIEVE_VNNI_ATTR inline void PrefillTile(const SmallBlockProblem& p,
                                        const DecodedSlice<kFormat, kW>& w, int64_t r0, int64_t x0,
                                        const Slice& s) {
  const int64_t num_blocks = p.cols / kQBlock;
  __m512 acc[kW][kX];
  for (int r = 0; r < kW; ++r) {
    for (int i = 0; i < kX; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int64_t b = s.begin; b < s.end; b += 2) {
    const bool pair = b + 1 < s.end;
    ActivationPair x[kX];
    for (int i = 0; i < kX; ++i)
      x[i] = PrepareActivations<kFormat>(p, (x0 + i) * num_blocks + b, pair);
    for (int r = 0; r < kW; ++r) {
      const WeightPair<kFormat>& wp = w.pairs[r][(b - s.begin) / 2];
      for (int i = 0; i < kX; ++i) acc[r][i] = Accumulate<kFormat>(wp, x[i], acc[r][i]);
    }
  }
  StoreTile<kW, kX>(p, r0, x0, s, acc);
}

// Weight rows [r0, r0 + kW) against every activation row.
template <SmallBlockFormat kFormat, int kW>
SIEVE_VNNI_ATTR inline void WeightTile(const SmallBlockProblem& p, int64_t r0, int64_t num_x,
                                       const Slice& s) {
  DecodedSlice<kFormat, kW> w;
  w.Fill(p, r0, s);
  int64_t x0 = 0;
  for (; x0 + kRowsX <= num_x; x0 += kRowsX) PrefillTile<kFormat, kW, kRowsX>(p, w, r0, x0, s);
  switch (num_x - x0) {
    case 3:
      PrefillTile<kFormat, kW, 3>(p, w, r0, x0, s);
      break;
    case 2:
      PrefillTile<kFormat, kW, 2>(p, w, r0, x0, s);
      break;
    case 1:
      PrefillTile<kFormat, kW, 1>(p, w, r0, x0, s);
      break;
    default:
      break;
  }
}

// The slice's bytes of weight rows [r0, r1) into L1, ahead of use.
SIEVE_VNNI_ATTR inline void PrefetchRows(const SmallBlockProblem& p, size_t block_bytes, int64_t r0,
                                         int64_t r1, const Slice& s) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* row = reinterpret_cast<const char*>(p.w + r * p.row_bytes);
    const char* end = row + s.end * block_bytes;
    for (const char* line = row + s.begin * block_bytes; line < end; line += 64)
      _mm_prefetch(line, _MM_HINT_T0);
  }
}

// ---------------------------------------------------------------- prefill in 16-row groups

// kGroupRows weight rows x a slice's blocks, decoded for vpdpbusd against 4 broadcast activation
// bytes: levels[b][k] holds columns 4k .. 4k + 3 of block b, 4 bytes per row for the 16 rows.
// 20 KiB with minimums: it stays in L1 while the activation rows pass over it.
inline constexpr int kGroupRows = 16;
template <SmallBlockFormat kFormat>
struct LevelTile {
  alignas(64) uint8_t levels[kSliceBlocks][8][64];
  alignas(64) float scales[kSliceBlocks][kGroupRows];                            // d_w
  alignas(64) float mins[Format<kFormat>::kMin ? kSliceBlocks : 1][kGroupRows];  // m_w
};

// The group's rows [r0, r0 + 16) & `rows` over the slice into the tile; rows outside `rows`
// are zeros (scale 0: they add nothing). Per row and block pair the decode path's Decode() (64
// bytes, in column order), then per block pair one 16 x 16 transpose of 4-byte groups.
template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR inline void FillTile(const SmallBlockProblem& p, int64_t r0, int num_rows,
                                     const Slice& s, LevelTile<kFormat>& t) {
  using F = Format<kFormat>;
  using Block = typename F::Block;
  alignas(64) uint16_t scales16[kSliceBlocks][kGroupRows];
  alignas(64) uint16_t mins16[F::kMin ? kSliceBlocks : 1][kGroupRows];
  for (int64_t b = s.begin; b < s.end; b += 2) {
    const int64_t tb = b - s.begin;
    const bool pair = b + 1 < s.end;
    __m512i rows16[kGroupRows];
    for (int r = 0; r < kGroupRows; ++r) {
      if (r >= num_rows) {
        rows16[r] = _mm512_setzero_si512();
        scales16[tb][r] = scales16[tb + 1][r] = 0;
        if constexpr (F::kMin) mins16[tb][r] = mins16[tb + 1][r] = 0;
        continue;
      }
      const Block* block = reinterpret_cast<const Block*>(p.w + (r0 + r) * p.row_bytes) + b;
      const DecodedPair<kFormat> decoded = Decode<kFormat>(block, pair);
      rows16[r] = decoded.u;
      // Without a pair the upper half is zero (scale 0 for the unused block tb + 1).
      constexpr int kBits = F::kMin ? 32 : 16;
      scales16[tb][r] = static_cast<uint16_t>(decoded.scales);
      scales16[tb + 1][r] = static_cast<uint16_t>(decoded.scales >> kBits);
      if constexpr (F::kMin) {
        mins16[tb][r] = static_cast<uint16_t>(decoded.scales >> 16);
        mins16[tb + 1][r] = static_cast<uint16_t>(decoded.scales >> 48);
      }
    }
    Transpose16x16(rows16, t.levels[tb][0]);  // blocks tb and tb + 1
  }
  const int64_t num_pairs_blocks = (s.end - s.begin + 1) / 2 * 2;
  for (int64_t tb = 0; tb < num_pairs_blocks; ++tb) {
    _mm512_store_ps(
        t.scales[tb],
        _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(scales16[tb]))));
    if constexpr (F::kMin) {
      _mm512_store_ps(
          t.mins[tb],
          _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(mins16[tb]))));
    }
  }
}

// Activation rows [x0, x0 + kX) over the tile of rows [r0, r0 + 16) & `rows`. Per block and
// activation row: 8 vpdpbusd into int32 lanes that start at the offset correction (exact, as
// the decode path), one conversion, one FMA with d_w * d_x (+ one with m_w * s_x).
template <SmallBlockFormat kFormat, int kX>
SIEVE_VNNI_ATTR inline void ActivationTile(const SmallBlockProblem& p, const LevelTile<kFormat>& t,
                                           int64_t r0, __mmask16 rows, int64_t x0, const Slice& s) {
  using F = Format<kFormat>;
  const int64_t num_blocks = p.cols / kQBlock;
  __m512 acc[kX];
  for (int i = 0; i < kX; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = s.begin; b < s.end; ++b) {
    const int64_t tb = b - s.begin;
    __m512i w[8];
    for (int k = 0; k < 8; ++k) w[k] = _mm512_load_si512(t.levels[tb][k]);
    const __m512 dw = _mm512_load_ps(t.scales[tb]);
#pragma GCC unroll 16  // keeps the accumulators in registers
    for (int i = 0; i < kX; ++i) {
      const int64_t xb = (x0 + i) * num_blocks + b;
      const int8_t* xq = p.xq + xb * kQBlock;
      __m512i dot = _mm512_setzero_si512();
      if constexpr (F::kOffset != 0) dot = _mm512_set1_epi32(p.offset_sums[xb]);
      for (int k = 0; k < 8; ++k) dot = DpbusdBroadcast(dot, w[k], xq + 4 * k);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(p.xd[xb])),
                               acc[i]);
      if constexpr (F::kMin)
        acc[i] = _mm512_fmadd_ps(_mm512_load_ps(t.mins[tb]), _mm512_set1_ps(p.xsum[xb]), acc[i]);
    }
  }
  for (int i = 0; i < kX; ++i) {
    float* out = p.y + (x0 + i) * p.rows + r0;
    const __m512 value =
        s.accumulate ? _mm512_add_ps(_mm512_maskz_loadu_ps(rows, out), acc[i]) : acc[i];
    _mm512_mask_storeu_ps(out, rows, value);
  }
}

// 8 accumulators + 8 level vectors + scales, minimums and temporaries in the 32 zmm.
inline constexpr int kGroupRowsX = 8;

// The last num_x_left < kGroupRowsX activation rows as one tile.
template <SmallBlockFormat kFormat, int kX>
SIEVE_VNNI_ATTR inline void ActivationRemainder(const SmallBlockProblem& p,
                                                const LevelTile<kFormat>& t, int64_t r0,
                                                __mmask16 rows, int64_t x0, int64_t num_x_left,
                                                const Slice& s) {
  if constexpr (kX > 0) {
    if (num_x_left == kX) return ActivationTile<kFormat, kX>(p, t, r0, rows, x0, s);
    ActivationRemainder<kFormat, kX - 1>(p, t, r0, rows, x0, num_x_left, s);
  }
}

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR void Groups(const SmallBlockProblem& p, int64_t g_begin, int64_t g_end,
                            int64_t num_x) {
  const int64_t num_blocks = p.cols / kQBlock;
  LevelTile<kFormat> tile;
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t r0 = g * kGroupRows;
    const int num_rows = static_cast<int>(std::min<int64_t>(kGroupRows, p.rows - r0));
    const __mmask16 rows = static_cast<__mmask16>((1u << num_rows) - 1);
    for (int64_t b0 = 0; b0 < num_blocks; b0 += kSliceBlocks) {
      const Slice s{b0, std::min(num_blocks, b0 + kSliceBlocks), b0 != 0};
      FillTile<kFormat>(p, r0, num_rows, s, tile);
      int64_t x0 = 0;
      for (; x0 + kGroupRowsX <= num_x; x0 += kGroupRowsX)
        ActivationTile<kFormat, kGroupRowsX>(p, tile, r0, rows, x0, s);
      ActivationRemainder<kFormat, kGroupRowsX - 1>(p, tile, r0, rows, x0, num_x - x0, s);
    }
  }
}

// ---------------------------------------------------------------- packed 16-row groups

// The 8 level vectors of one packed block (see packed_block_bytes()): u[k] columns 4k .. 4k + 3
// and u[4 + k] columns 16 + 4k .. 16 + 4k + 3 of the 16 rows, one int32 lane per row.
template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR inline void UnpackLevels(const uint8_t* block, __m512i (&u)[8]) {
  using F = Format<kFormat>;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const uint8_t* qs = block + packed_levels_offset(kFormat);
  for (int k = 0; k < 4; ++k) {
    const __m512i v = _mm512_loadu_si512(qs + 64 * k);
    u[k] = _mm512_and_si512(v, nibble);
    u[4 + k] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
  }
  if constexpr (F::kFifthBits) {
    // Lane r holds row r's qh (bit c: column c). Level vector v's byte j of lane r needs bit
    // c = 4v + j (v < 4) or 16 + 4(v - 4) + j: the lane's byte c / 8 is copied into the 4 bytes
    // (vpshufb within 128-bit lanes), then tested against bit c % 8.
    const __m512i qh = _mm512_loadu_si512(block + packed_fifth_offset(kFormat));
    // Byte 4m + j of each 128-bit lane reads byte 4m + c / 8 (m: the int32 lane within it).
    const __m512i lane_bytes = _mm512_set_epi32(
        0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0, 0x0C0C0C0C,
        0x08080808, 0x04040404, 0, 0x0C0C0C0C, 0x08080808, 0x04040404, 0);
    const __m512i sixteen = _mm512_set1_epi8(0x10);
    for (int v = 0; v < 8; ++v) {
      const int first_bit = v < 4 ? 4 * v : 16 + 4 * (v - 4);
      const int byte = first_bit / 8, shift = first_bit % 8;
      const __m512i index = _mm512_add_epi8(lane_bytes, _mm512_set1_epi8(static_cast<char>(byte)));
      const __m512i bits = _mm512_set1_epi32(static_cast<int>(0x08040201u << shift));
      const __mmask64 set = _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, index), bits);
      u[v] = _mm512_mask_add_epi8(u[v], set, u[v], sixteen);
    }
  }
  if constexpr (F::kTable) {
    alignas(16) static constexpr std::array<uint8_t, 16> kBiased = BiasedIQ4NLValues();
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kBiased.data())));
    for (int v = 0; v < 8; ++v) u[v] = _mm512_shuffle_epi8(table, u[v]);
  }
}

// 16 weight rows (group g) x activation rows [x0, x0 + kX), all blocks. Two vpdpbusd chains
// per activation row and block (low and high nibbles): decode's single row is not bound by the
// latency of one chain of 8, and prefill was slower with one (-7%, Q4_0, one thread).
template <SmallBlockFormat kFormat, int kX>
SIEVE_VNNI_ATTR inline void PackedGroupTile(const SmallBlockProblem& p, int64_t g, int64_t x0,
                                            bool prefetch) {
  using F = Format<kFormat>;
  static_assert(F::kMin == packed_has_min(kFormat) &&
                F::kFifthBits == packed_has_fifth_bits(kFormat));
  constexpr int64_t kBytes = packed_block_bytes(kFormat);
  const int64_t num_blocks = p.cols / kQBlock;
  const uint8_t* group = p.w + g * num_blocks * kBytes;
  __m512 acc[kX];
  for (int i = 0; i < kX; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = group + b * kBytes;
    if (prefetch) PrefetchPackedAhead<kBytes>(block);
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    __m512 mw = _mm512_setzero_ps();
    if constexpr (F::kMin)
      mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32)));
    __m512i u[8];
    UnpackLevels<kFormat>(block, u);
#pragma GCC unroll 8  // keeps the accumulators in registers
    for (int i = 0; i < kX; ++i) {
      const int64_t xb = (x0 + i) * num_blocks + b;
      const int8_t* xq = p.xq + xb * kQBlock;
      __m512i low = _mm512_setzero_si512(), high = _mm512_setzero_si512();
      if constexpr (F::kOffset != 0) low = _mm512_set1_epi32(p.offset_sums[xb]);
      for (int k = 0; k < 4; ++k) {
        low = DpbusdBroadcast(low, u[k], xq + 4 * k);
        high = DpbusdBroadcast(high, u[4 + k], xq + 16 + 4 * k);
      }
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(low, high)),
                               _mm512_mul_ps(dw, _mm512_set1_ps(p.xd[xb])), acc[i]);
      if constexpr (F::kMin) acc[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(p.xsum[xb]), acc[i]);
    }
  }
  const int64_t r0 = g * kGroupRows;
  const __mmask16 rows =
      p.rows - r0 >= kGroupRows ? 0xFFFF : static_cast<__mmask16>((1u << (p.rows - r0)) - 1);
  for (int i = 0; i < kX; ++i) _mm512_mask_storeu_ps(p.y + (x0 + i) * p.rows + r0, rows, acc[i]);
}

template <SmallBlockFormat kFormat, int kX>
SIEVE_VNNI_ATTR inline void PackedRemainder(const SmallBlockProblem& p, int64_t g, int64_t x0,
                                            int64_t num_x_left, bool prefetch) {
  if constexpr (kX > 0) {
    if (num_x_left == kX) return PackedGroupTile<kFormat, kX>(p, g, x0, prefetch);
    PackedRemainder<kFormat, kX - 1>(p, g, x0, num_x_left, prefetch);
  }
}

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR void PackedGroups(const SmallBlockProblem& p, int64_t g_begin, int64_t g_end,
                                  int64_t num_x) {
  const bool prefetch = packed_block_prefetch();
  for (int64_t g = g_begin; g < g_end; ++g) {
    int64_t x0 = 0;
    for (; x0 + kGroupRowsX <= num_x; x0 += kGroupRowsX)
      PackedGroupTile<kFormat, kGroupRowsX>(p, g, x0, prefetch);
    PackedRemainder<kFormat, kGroupRowsX - 1>(p, g, x0, num_x - x0, prefetch);
  }
}

// ---------------------------------------------------------------- decode and small prefill

template <SmallBlockFormat kFormat>
SIEVE_VNNI_ATTR void Rows(const SmallBlockProblem& p, int64_t r_begin, int64_t r_end,
                          int64_t num_x) {
  constexpr size_t kBlockBytes = sizeof(typename Format<kFormat>::Block);
  const int64_t num_blocks = p.cols / kQBlock;
  if (num_x == 1) {  // decode: whole rows, 4 at a time (the activation row stays in L1)
    const Slice s{0, num_blocks, false};
    const bool stream = p.row_bytes < kStreamMaxRowBytes;
    int64_t r = r_begin;
    for (; r + kRowsW <= r_end; r += kRowsW) DecodeTile<kFormat, kRowsW>(p, r, s, stream);
    for (; r < r_end; ++r) DecodeTile<kFormat, 1>(p, r, s, false);
    return;
  }
  for (int64_t b0 = 0; b0 < num_blocks; b0 += kSliceBlocks) {
    const Slice s{b0, std::min(num_blocks, b0 + kSliceBlocks), b0 != 0};
    int64_t r = r_begin;
    for (; r + kRowsW <= r_end; r += kRowsW) {
      PrefetchRows(p, kBlockBytes, r + kRowsW, std::min(r_end, r + 2 * kRowsW), s);
      WeightTile<kFormat, kRowsW>(p, r, num_x, s);
    }
    for (; r < r_end; ++r) WeightTile<kFormat, 1>(p, r, num_x, s);
  }
}

}  // namespace

SIEVE_VNNI_ATTR void small_block_rows(const SmallBlockProblem& p, int64_t r_begin, int64_t r_end,
                                      int64_t num_x) {
  switch (p.format) {
    case SmallBlockFormat::kQ4_0:
      return Rows<SmallBlockFormat::kQ4_0>(p, r_begin, r_end, num_x);
    case SmallBlockFormat::kQ4_1:
      return Rows<SmallBlockFormat::kQ4_1>(p, r_begin, r_end, num_x);
    case SmallBlockFormat::kQ5_0:
      return Rows<SmallBlockFormat::kQ5_0>(p, r_begin, r_end, num_x);
    case SmallBlockFormat::kQ5_1:
      return Rows<SmallBlockFormat::kQ5_1>(p, r_begin, r_end, num_x);
    case SmallBlockFormat::kIQ4_NL:
      return Rows<SmallBlockFormat::kIQ4_NL>(p, r_begin, r_end, num_x);
  }
}

SIEVE_VNNI_ATTR void small_block_groups(const SmallBlockProblem& p, int64_t g_begin, int64_t g_end,
                                        int64_t num_x) {
  switch (p.format) {
    case SmallBlockFormat::kQ4_0:
      return Groups<SmallBlockFormat::kQ4_0>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kQ4_1:
      return Groups<SmallBlockFormat::kQ4_1>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kQ5_0:
      return Groups<SmallBlockFormat::kQ5_0>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kQ5_1:
      return Groups<SmallBlockFormat::kQ5_1>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kIQ4_NL:
      return Groups<SmallBlockFormat::kIQ4_NL>(p, g_begin, g_end, num_x);
  }
}

SIEVE_VNNI_ATTR void packed_small_block_groups(const SmallBlockProblem& p, int64_t g_begin,
                                               int64_t g_end, int64_t num_x) {
  switch (p.format) {
    case SmallBlockFormat::kQ4_0:
      return PackedGroups<SmallBlockFormat::kQ4_0>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kQ4_1:
      return PackedGroups<SmallBlockFormat::kQ4_1>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kQ5_0:
      return PackedGroups<SmallBlockFormat::kQ5_0>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kQ5_1:
      return PackedGroups<SmallBlockFormat::kQ5_1>(p, g_begin, g_end, num_x);
    case SmallBlockFormat::kIQ4_NL:
      return PackedGroups<SmallBlockFormat::kIQ4_NL>(p, g_begin, g_end, num_x);
  }
}

#else  // not x86-64 with GCC/Clang: vnni::supported() is false, nothing calls this

void small_block_rows(const SmallBlockProblem&, int64_t, int64_t, int64_t) {}
void small_block_groups(const SmallBlockProblem&, int64_t, int64_t, int64_t) {}
void packed_small_block_groups(const SmallBlockProblem&, int64_t, int64_t, int64_t) {}

#endif

}  // namespace sieve::kernels::vnni
