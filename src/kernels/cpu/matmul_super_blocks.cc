// One file above the ~800-line guideline on purpose: a kernel family (six weight types sharing
// one unpack-then-multiply scheme and its Highway per-target inclusion); split by type it would
// repeat the scheme six times.
//
// matmul() for the super-block weight types (Q2_K .. Q6_K, IQ4_XS; decodings in
// kernels/quant_super_blocks.h), per Highway target, driven by matmul-inl.h's Run()/RunRows().
//
// x is first quantized to Q8_K (as ggml does: one f32 scale per 256 values, sums per 16). Per
// weight super-block and activation row the kernels compute, in integers,
//   S = sum_e scale[e / 16] * u[e] * q_x[e]      M = sum_s min[s] * bsum_x[s]
// with u the block's unsigned levels (Q3_K's and Q6_K's offsets of 4 and 32 become mins of
// 4 * scale and 32 * scale), then y += d_w * d_x * S - dmin_w * d_x * M: one int->float
// conversion and one or two FMAs per 256 values.
//   x86 AVX2 / AVX-512 targets: the block is unpacked once into 8 vectors of 32 u8 levels (in
//     x's element order) and 8 vectors of 16 i16 scales (one per pair of lanes); per vector
//     pmaddubsw (u8 x s8 -> i16 pairs) then pmaddwd with the scales (-> i32, scale applied in
//     integer), summed in 8 i32 lanes. IQ4_XS's levels are signed (its code book spans
//     [-127, 113]): |w| and sign(x, w) as in matmul-inl.h's BlockDot.
//   AVX-512 targets below kVnniMinRows activation rows (decode), Q2_K, Q4_K .. Q6_K, IQ4_XS: the
//     same integer sums 512 bits wide on four 64-level vectors per block, with the activation
//     row reordered once per matmul to the weights' nibble order (DecodeKernel512).
//   AVX-512 target on CPUs with VNNI, from kVnniMinRows activation rows: 16 weight rows x 1024
//     columns unpacked the same way, transposed into vpdpbusd's layout and run against every
//     activation row by the dense micro-kernel of cpu/matmul_super_blocks_vnni.cc (scales and
//     mins in f32 per row and 16 or 32 columns there; offsets folded into the activation sums).
//   other targets: the scalar decoding (quant::decode_super_block) and plain integer loops.
// Ranges: u <= 63, |q_x| <= 127, so pmaddubsw pairs stay below 2^15; |scale| <= 128 and 256
// values per block keep every i32 lane below 2^31.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/matmul_super_blocks.cc"
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/cpu/matmul-inl.h"
#include "kernels/cpu/matmul_super_blocks_vnni.h"
#include "kernels/cpu/transpose16x16.h"
#include "kernels/quant_super_blocks.h"

HWY_BEFORE_NAMESPACE();
namespace sieve::kernels::HWY_NAMESPACE {

// From this many activation rows on, AVX-512 VNNI CPUs run the prefill tiles. Measured on Zen 4
// (4096x4096, one core): 2 rows about even (Q4_K 72 vs 59 GFLOP/s, Q6_K 40 vs 53), 4 rows the
// tiles 1.2x (Q4_K) to 2.3x (Q6_K) faster.
inline constexpr int64_t kVnniMinRows = 3;

// One row of activations (num_blocks * 256 values) -> Q8_K, bit-identical to
// quant::quantize_row_q8_k: d = max / -127 for the first value of largest magnitude, q =
// min(127, round_half_even(x * (-127 / max))), bsums per 16.
HWY_INLINE void QuantizeRowQ8_K(const float* HWY_RESTRICT x, int64_t num_blocks,
                                BlockQ8_K* HWY_RESTRICT out) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const size_t N = hn::Lanes(df);
  for (int64_t b = 0; b < num_blocks; ++b, x += kQKBlock) {
    BlockQ8_K& y = out[b];
    auto vmax = hn::Zero(df);
    for (size_t k = 0; k < kQKBlock; k += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, x + k)));
    const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
    if (amax == 0.0f) {
      std::memset(&y, 0, sizeof(y));
      continue;
    }
    float max = 0.0f;
    for (int j = 0; j < kQKBlock; ++j) {
      if (std::fabs(x[j]) == amax) {
        max = x[j];
        break;
      }
    }
    const float iscale = -127.f / max;
    const auto vscale = hn::Set(df, iscale);
    const auto limit = hn::Set(di, 127);
    int32_t q[kQKBlock];
    for (size_t k = 0; k < kQKBlock; k += N) {
      hn::StoreU(hn::Min(hn::NearestInt(hn::Mul(hn::LoadU(df, x + k), vscale)), limit), di, q + k);
    }
    for (int s = 0; s < kQKBlock / 16; ++s) {
      int32_t sum = 0;
      for (int j = 16 * s; j < 16 * s + 16; ++j) {
        y.qs[j] = static_cast<int8_t>(q[j]);
        sum += q[j];
      }
      y.bsums[s] = static_cast<int16_t>(sum);
    }
    y.d = 1 / iscale;
  }
}

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// A weight super-block unpacked for the dot products against Q8_K (see the file comment).
struct Unpacked {
  __m256i u[8];       // levels of values 32v .. 32v + 31 (IQ4_XS: |w|)
  __m256i sign[8];    // IQ4_XS only: the signed values, for sign(x, w)
  __m256i scales[8];  // i16 lanes 0-7: scale of sub-block 2v, lanes 8-15: of 2v + 1
  __m256i mins;       // i16 per 16 values, against bsums
  float d, dmin;
};

HWY_INLINE float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }

HWY_INLINE uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Spreads 16 i8 scales (one per 16 values) to the 8 pair-of-lanes vectors: scales 0-7 and 8-15
// widened to i16 in both 128-bit halves, then one in-lane byte shuffle per vector.
HWY_INLINE void SpreadScales16(__m128i scales_i8, __m256i* out) {
  const __m256i first = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(scales_i8));
  const __m256i second =
      _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_srli_si128(scales_i8, 8)));
  for (int v = 0; v < 8; ++v) {
    const int e = 2 * (v % 4);  // i16 element of sub-block 2v (low half) and e + 1 (high half)
    const __m256i pattern =
        _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(((2 * e + 3) << 8) | (2 * e + 2))),
                         _mm_set1_epi16(static_cast<int16_t>(((2 * e + 1) << 8) | (2 * e))));
    out[v] = _mm256_shuffle_epi8(v < 4 ? first : second, pattern);
  }
}
// 8 i8 scales (one per 32 values) in the low 8 bytes: vector v gets scale v in every lane.
HWY_INLINE void SpreadScales8(__m128i scales_i8, __m256i* out) {
  const __m256i all = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(scales_i8));
  for (int v = 0; v < 8; ++v) {
    out[v] = _mm256_shuffle_epi8(
        all, _mm256_set1_epi16(static_cast<int16_t>(((2 * v + 1) << 8) | (2 * v))));
  }
}

// Unpack policies, one per type. Traits for the AVX2 tiles: kSigned (IQ4_XS: signed levels,
// dot products through |w| and sign(x, w)), kMinUsesD (the min term is the levels' offset times
// the scale, so it is subtracted in integer before the one FMA with d: Q3_K, Q6_K). For the
// VNNI tiles: kGroupCols (columns per scale), kLevelOffset (taken off the u8 levels through the
// activation sums) and kHasMins (a separate min per group, scaled by dmin).
struct Q2_KUnpack {
  using Block = BlockQ2_K;
  static constexpr int kGroupCols = 16, kLevelOffset = 0;
  static constexpr bool kHasMins = true;
  static constexpr bool kSigned = false, kMinUsesD = false;
  static HWY_INLINE void Unpack(const Block& b, Unpacked* out) {
    const __m256i mask = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * half));
      out->u[4 * half + 0] = _mm256_and_si256(q, mask);
      out->u[4 * half + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 2), mask);
      out->u[4 * half + 2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
      out->u[4 * half + 3] = _mm256_and_si256(_mm256_srli_epi16(q, 6), mask);
    }
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i nibble = _mm_set1_epi8(0xF);
    SpreadScales16(_mm_and_si128(packed, nibble), out->scales);
    out->mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q3_KUnpack {
  using Block = BlockQ3_K;
  static constexpr int kGroupCols = 16, kLevelOffset = 4;
  static constexpr bool kHasMins = false;
  static constexpr bool kSigned = false, kMinUsesD = true;  // u = q + 4: min = 4 * scale
  static HWY_INLINE void Unpack(const Block& b, Unpacked* out) {
    const __m256i mask = _mm256_set1_epi8(3);
    const __m256i four = _mm256_set1_epi8(4);
    const __m256i hmask = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.hmask));
    for (int half = 0; half < 2; ++half) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * half));
      // Level v = 4 half + k: bits 2k of q, plus bit v of hmask moved to bit 2 (16-bit shifts:
      // bit 2 of each byte comes from the same byte).
      const __m256i hm = half == 0 ? _mm256_slli_epi16(hmask, 2) : _mm256_srli_epi16(hmask, 2);
      out->u[4 * half + 0] = _mm256_or_si256(_mm256_and_si256(q, mask), _mm256_and_si256(hm, four));
      out->u[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 2), mask),
                                             _mm256_and_si256(_mm256_srli_epi16(hm, 1), four));
      out->u[4 * half + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), mask),
                                             _mm256_and_si256(_mm256_srli_epi16(hm, 2), four));
      out->u[4 * half + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 6), mask),
                                             _mm256_and_si256(_mm256_srli_epi16(hm, 3), four));
    }
    // 16 6-bit scales: low nibbles in bytes 0-7 (s < 8 low, s >= 8 high nibble of byte s - 8),
    // high 2 bits in bytes 8-11 (bits 2 (s / 4) of byte 8 + s % 4).
    const uint32_t a = Load32(b.scales), c = Load32(b.scales + 4), h = Load32(b.scales + 8);
    const uint32_t low4 = 0x0F0F0F0Fu, low2 = 0x03030303u;
    const __m128i raw =
        _mm_set_epi32(static_cast<int>(((c >> 4) & low4) | (((h >> 6) & low2) << 4)),
                      static_cast<int>(((a >> 4) & low4) | (((h >> 4) & low2) << 4)),
                      static_cast<int>((c & low4) | (((h >> 2) & low2) << 4)),
                      static_cast<int>((a & low4) | ((h & low2) << 4)));
    const __m128i scales = _mm_sub_epi8(raw, _mm_set1_epi8(32));
    SpreadScales16(scales, out->scales);
    out->mins = _mm256_slli_epi16(_mm256_cvtepi8_epi16(scales), 2);
    out->d = out->dmin = HalfToFloat(b.d);
  }
};

// Q4_K / Q5_K scales and mins: 8 6-bit each, from 12 bytes (see quant_super_blocks.h).
HWY_INLINE void UnpackScalesK4(const uint8_t* s, Unpacked* out) {
  // Bytes a = s[0..3], m = s[4..7], c = s[8..11] (the load reads 4 bytes of qs after them).
  // Out: scales 0-3 = a & 63, 4-7 = (c & 15) | (a >> 6) << 4; mins likewise from m and c >> 4.
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i acmc =
      _mm_shuffle_epi8(v, _mm_set_epi8(11, 10, 9, 8, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0));
  const __m128i tops =
      _mm_shuffle_epi8(v, _mm_set_epi8(7, 6, 5, 4, -1, -1, -1, -1, 3, 2, 1, 0, -1, -1, -1, -1));
  const __m128i low =
      _mm_or_si128(_mm_and_si128(acmc, _mm_set_epi32(0, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F)),
                   _mm_and_si128(_mm_srli_epi16(acmc, 4), _mm_set_epi32(0x0F0F0F0F, 0, 0, 0)));
  const __m128i both =
      _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(tops, 2), _mm_set1_epi8(0x30)));
  SpreadScales8(both, out->scales);
  // min j against bsums 2j and 2j + 1.
  const __m128i pairs = _mm_set_epi8(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8);
  out->mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(both, pairs));
}

struct Q4_KUnpack {
  using Block = BlockQ4_K;
  static constexpr int kGroupCols = 32, kLevelOffset = 0;
  static constexpr bool kHasMins = true;
  static constexpr bool kSigned = false, kMinUsesD = false;
  static HWY_INLINE void Unpack(const Block& b, Unpacked* out) {
    const __m256i nibble = _mm256_set1_epi8(0xF);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      out->u[2 * c] = _mm256_and_si256(q, nibble);
      out->u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
    }
    UnpackScalesK4(b.scales, out);
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q5_KUnpack {
  using Block = BlockQ5_K;
  static constexpr int kGroupCols = 32, kLevelOffset = 0;
  static constexpr bool kHasMins = true;
  static constexpr bool kSigned = false, kMinUsesD = false;
  static HWY_INLINE void Unpack(const Block& b, Unpacked* out) {
    const __m256i nibble = _mm256_set1_epi8(0xF);
    const __m256i bit4 = _mm256_set1_epi8(0x10);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    for (int c = 0; c < 4; ++c) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * c));
      out->u[2 * c] = _mm256_and_si256(q, nibble);
      out->u[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
    }
    // Bit v of qh[l] -> bit 4 of level v (16-bit shifts: bit 4 of each byte comes from the same
    // byte).
    out->u[0] = _mm256_or_si256(out->u[0], _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4));
    out->u[1] = _mm256_or_si256(out->u[1], _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4));
    out->u[2] = _mm256_or_si256(out->u[2], _mm256_and_si256(_mm256_slli_epi16(qh, 2), bit4));
    out->u[3] = _mm256_or_si256(out->u[3], _mm256_and_si256(_mm256_slli_epi16(qh, 1), bit4));
    out->u[4] = _mm256_or_si256(out->u[4], _mm256_and_si256(qh, bit4));
    out->u[5] = _mm256_or_si256(out->u[5], _mm256_and_si256(_mm256_srli_epi16(qh, 1), bit4));
    out->u[6] = _mm256_or_si256(out->u[6], _mm256_and_si256(_mm256_srli_epi16(qh, 2), bit4));
    out->u[7] = _mm256_or_si256(out->u[7], _mm256_and_si256(_mm256_srli_epi16(qh, 3), bit4));
    UnpackScalesK4(b.scales, out);
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q6_KUnpack {
  using Block = BlockQ6_K;
  static constexpr int kGroupCols = 16, kLevelOffset = 32;
  static constexpr bool kHasMins = false;
  static constexpr bool kSigned = false, kMinUsesD = true;  // u = q + 32: min = 32 * scale
  static HWY_INLINE void Unpack(const Block& b, Unpacked* out) {
    const __m256i nibble = _mm256_set1_epi8(0xF);
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * half));
      const __m256i l1 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * half + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * half));
      // Quarter k: low nibbles of l0, l1, high nibbles of l0, l1; high bits 2k, 2k + 1 of h.
      out->u[4 * half + 0] = _mm256_or_si256(_mm256_and_si256(l0, nibble),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 4), bits45));
      out->u[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(l1, nibble),
                                             _mm256_and_si256(_mm256_slli_epi16(h, 2), bits45));
      out->u[4 * half + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), nibble),
                                             _mm256_and_si256(h, bits45));
      out->u[4 * half + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), nibble),
                                             _mm256_and_si256(_mm256_srli_epi16(h, 2), bits45));
    }
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    SpreadScales16(scales, out->scales);
    out->mins = _mm256_slli_epi16(_mm256_cvtepi8_epi16(scales), 5);
    out->d = out->dmin = HalfToFloat(b.d);
  }
};

struct IQ4_XSUnpack {
  using Block = BlockIQ4_XS;
  static constexpr int kGroupCols = 32, kLevelOffset = 128;  // VNNI levels: value + 128
  static constexpr bool kHasMins = false;
  static constexpr bool kSigned = true, kMinUsesD = false;
  static HWY_INLINE void Unpack(const Block& b, Unpacked* out) {
    const __m128i book = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues));
    const __m256i table = _mm256_broadcastsi128_si256(book);
    const __m256i nibble = _mm256_set1_epi8(0xF);
    for (int v = 0; v < 8; v += 2) {
      // Sub-block v: low nibbles of bytes 0-15 then their high nibbles; v + 1: bytes 16-31.
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 16 * v));
      const __m256i low = _mm256_and_si256(q, nibble),
                    high = _mm256_and_si256(_mm256_srli_epi16(q, 4), nibble);
      out->sign[v] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(low, high, 0x20));
      out->sign[v + 1] = _mm256_shuffle_epi8(table, _mm256_permute2x128_si256(low, high, 0x31));
      out->u[v] = _mm256_abs_epi8(out->sign[v]);
      out->u[v + 1] = _mm256_abs_epi8(out->sign[v + 1]);
    }
    // Byte s = low nibble s of scales_l | bits 2s, 2s + 1 of scales_h << 4 (pdep spreads the
    // fields to bytes), then minus 32.
    const uint64_t packed = _pdep_u64(Load32(b.scales_l), 0x0F0F0F0F0F0F0F0Full) |
                            (_pdep_u64(b.scales_h, 0x0303030303030303ull) << 4);
    SpreadScales8(_mm_sub_epi8(_mm_cvtsi64_si128(static_cast<int64_t>(packed)), _mm_set1_epi8(32)),
                  out->scales);
    out->mins = _mm256_setzero_si256();
    out->d = HalfToFloat(b.d);
    out->dmin = 0.0f;
  }
};

// Weights of Row's type against Q8_K activations: y[x0 + i][r0 + r] for r < kW, i < kX. Per
// super-block: kW unpacks, each used for the kX activation rows.
template <class Row>
struct SuperBlockKernel {
  using Block = typename Row::Block;
  const uint8_t* w;  // rows * row_bytes bytes
  size_t row_bytes;  // cols / 256 * sizeof(Block)
  int64_t rows, cols;
  const BlockQ8_K* x;  // [num_x][cols / 256]
  float* y;            // [num_x][rows]

  template <int kW, int kX>
  HWY_INLINE void Tile(int64_t r0, int64_t x0, ColumnSlice slice) const {
    const int64_t num_blocks = cols / kQKBlock;
    const Block* w_rows[kW];
    for (int r = 0; r < kW; ++r)
      w_rows[r] = reinterpret_cast<const Block*>(w + static_cast<size_t>(r0 + r) * row_bytes);
    const BlockQ8_K* x_rows[kX];
    for (int i = 0; i < kX; ++i) x_rows[i] = x + (x0 + i) * num_blocks;

    __m256 acc[kX][kW];
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) acc[i][r] = _mm256_setzero_ps();
    }
    const bool prefetch = UseRowPrefetcher(slice, cols, row_bytes);
    RowPrefetcher prefetcher(w_rows[0], kW * sizeof(Block));
    for (int64_t b = slice.begin / kQKBlock; b < slice.end / kQKBlock; ++b) {
      if (prefetch) prefetcher.Before(b);
        // Fully unrolled, so that acc stays in registers (a rolled loop indexes it in memory: a
        // store-to-load chain per block that cost ~30% of decode).
#pragma GCC unroll 8
      for (int r = 0; r < kW; ++r) {
        Unpacked unpacked;
        Row::Unpack(w_rows[r][b], &unpacked);
#pragma GCC unroll 8
        for (int i = 0; i < kX; ++i) {
          const BlockQ8_K& xb = x_rows[i][b];
          __m256i sum = _mm256_setzero_si256();
          for (int v = 0; v < 8; ++v) {
            __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs + 32 * v));
            if constexpr (Row::kSigned) xv = _mm256_sign_epi8(xv, unpacked.sign[v]);
            const __m256i pairs = _mm256_maddubs_epi16(unpacked.u[v], xv);
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, unpacked.scales[v]));
          }
          const float dx = xb.d;
          if constexpr (Row::kSigned) {
            acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(unpacked.d * dx),
                                        acc[i][r]);
          } else {
            const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
            const __m256i mins = _mm256_madd_epi16(bsums, unpacked.mins);
            if constexpr (Row::kMinUsesD) {
              acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum, mins)),
                                          _mm256_set1_ps(unpacked.d * dx), acc[i][r]);
            } else {
              acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_set1_ps(unpacked.d * dx),
                                          acc[i][r]);
              acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins),
                                          _mm256_set1_ps(-unpacked.dmin * dx), acc[i][r]);
            }
          }
        }
      }
    }
    const hn::Full256<float> df;
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) {
        StoreOutput(&y[(x0 + i) * rows + r0 + r], ReduceSum(df, hn::Vec256<float>{acc[i][r]}),
                    slice.accumulate);
      }
    }
  }
};

#if HWY_TARGET <= HWY_AVX3
// Decode (fewer than kVnniMinRows activation rows) of Q2_K, Q4_K, Q5_K, Q6_K and IQ4_XS, 512 bits
// wide on the GGUF layout. Per weight super-block: four 512-bit vectors of 64 u8 levels straight
// from the loads (one AND / shift per vector, no 256-bit recombination), four vectors of i16
// sub-block scales from one in-lane byte shuffle (or vpermw) each, then per activation row four
// pmaddubsw + pmaddwd. The activation row is reordered once per matmul to the weights' order:
// a 512-bit load of Q4_K / Q5_K qs holds 32-byte chunks c and c + 1, so its low nibbles are
// levels 2c and 2c + 2 (values 64c + l and 64c + 64 + l), its high nibbles levels 2c + 1 and
// 2c + 3. Q6_K's 64-byte ql halves already give 64 consecutive values per nibble.
// The integer sums per super-block are those of the 256-bit kernel; only the float
// accumulation order differs.

// One Q8_K activation block for these kernels: qs in the weight type's order, the Q8_K sums
// per 16 values (natural order) and per 32.
struct alignas(64) DecodeX {
  int8_t qs[kQKBlock];
  int16_t bsums[16];
  int16_t sums32[8];
  float d;
};

// Q4_K / Q5_K order: vector j (64 bytes) = levels lo(j), lo(j) + 2 with lo = 4 (j / 2) + j % 2.
HWY_INLINE void ReorderK4(const BlockQ8_K& in, DecodeX* out) {
  for (int j = 0; j < 4; ++j) {
    const int lo = 4 * (j / 2) + j % 2;
    std::memcpy(out->qs + 64 * j, in.qs + 32 * lo, 32);
    std::memcpy(out->qs + 64 * j + 32, in.qs + 32 * (lo + 2), 32);
  }
}
HWY_INLINE void ReorderNone(const BlockQ8_K& in, DecodeX* out) {
  std::memcpy(out->qs, in.qs, kQKBlock);
}

// i16 lanes 0-15 = byte a of every 128-bit lane of v, lanes 16-31 = byte b (zero-extended).
HWY_INLINE __m512i SpreadPair(__m512i v, int a, int b) {
  const __m512i pattern = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(0x8000 | a))),
      _mm256_set1_epi16(static_cast<int16_t>(0x8000 | b)), 1);
  return _mm512_shuffle_epi8(v, pattern);
}

// Per 16-bit lane: shift by `first` in lanes 0-15 and by `second` in lanes 16-31.
HWY_INLINE __m512i Counts(int first, int second) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(first))),
                            _mm256_set1_epi16(static_cast<int16_t>(second)), 1);
}

// Scales 0-7 in bytes 0-7, mins in bytes 8-15 (see UnpackScalesK4).
HWY_INLINE __m128i ScalesMinsK4(const uint8_t* s) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const __m128i acmc =
      _mm_shuffle_epi8(v, _mm_set_epi8(11, 10, 9, 8, 7, 6, 5, 4, 11, 10, 9, 8, 3, 2, 1, 0));
  const __m128i tops =
      _mm_shuffle_epi8(v, _mm_set_epi8(7, 6, 5, 4, -1, -1, -1, -1, 3, 2, 1, 0, -1, -1, -1, -1));
  const __m128i low =
      _mm_or_si128(_mm_and_si128(acmc, _mm_set_epi32(0, 0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F)),
                   _mm_and_si128(_mm_srli_epi16(acmc, 4), _mm_set_epi32(0x0F0F0F0F, 0, 0, 0)));
  return _mm_or_si128(low, _mm_and_si128(_mm_srli_epi16(tops, 2), _mm_set1_epi8(0x30)));
}

// A super-block decoded for DecodeKernel512: levels u[j] against DecodeX::qs + 64 j, i16 scales
// per pair of lanes; mins (Q4_K, Q5_K: 8 u8 -> i16 per 32 values, against sums32, scaled by
// dmin) or offsets (Q6_K: 32 * scale per 16 values, against bsums, scaled by d).
struct Decoded512 {
  __m512i u[4];
  __mmask64 negative[4];  // kSigned (IQ4_XS): the lanes of negative values (u = |w|)
  __m512i scales[4];
  __m128i mins32;  // kMins32
  __m256i mins16;  // kOffsets16 (scaled by d), kMins16 (scaled by dmin)
  float d, dmin;
};

HWY_INLINE void DecodeK4Scales(const uint8_t* scales, Decoded512* out) {
  const __m128i both = ScalesMinsK4(scales);
  const __m512i all = _mm512_broadcast_i32x4(both);
  out->scales[0] = SpreadPair(all, 0, 2);
  out->scales[1] = SpreadPair(all, 1, 3);
  out->scales[2] = SpreadPair(all, 4, 6);
  out->scales[3] = SpreadPair(all, 5, 7);
  out->mins32 = _mm_cvtepu8_epi16(_mm_srli_si128(both, 8));
}

struct Q4_KDecode {
  using Block = BlockQ4_K;
  static constexpr bool kMins32 = true, kOffsets16 = false, kMins16 = false, kSigned = false;
  static HWY_INLINE void Reorder(const BlockQ8_K& in, DecodeX* out) { ReorderK4(in, out); }
  static HWY_INLINE void Decode(const Block& b, Decoded512* out) {
    const __m512i nibble = _mm512_set1_epi8(0xF);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_loadu_si512(b.qs + 64 * h);
      out->u[2 * h] = _mm512_and_si512(q, nibble);
      out->u[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
    }
    DecodeK4Scales(b.scales, out);
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q5_KDecode {
  using Block = BlockQ5_K;
  static constexpr bool kMins32 = true, kOffsets16 = false, kMins16 = false, kSigned = false;
  static HWY_INLINE void Reorder(const BlockQ8_K& in, DecodeX* out) { ReorderK4(in, out); }
  static HWY_INLINE void Decode(const Block& b, Decoded512* out) {
    const __m512i nibble = _mm512_set1_epi8(0xF);
    const __m512i bit4 = _mm512_set1_epi8(0x10);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_loadu_si512(b.qs + 64 * h);
      out->u[2 * h] = _mm512_and_si512(q, nibble);
      out->u[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble);
    }
    // Bit v of qh[l] -> bit 4 of level v (16-bit shifts: bit 4 of each byte comes from the
    // same byte). Vector j holds levels lo(j) (lanes 0-15) and lo(j) + 2 (lanes 16-31).
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
    out->u[0] =
        _mm512_or_si512(out->u[0], _mm512_and_si512(_mm512_sllv_epi16(qh, Counts(4, 2)), bit4));
    out->u[1] =
        _mm512_or_si512(out->u[1], _mm512_and_si512(_mm512_sllv_epi16(qh, Counts(3, 1)), bit4));
    out->u[2] =
        _mm512_or_si512(out->u[2], _mm512_and_si512(_mm512_srlv_epi16(qh, Counts(0, 2)), bit4));
    out->u[3] =
        _mm512_or_si512(out->u[3], _mm512_and_si512(_mm512_srlv_epi16(qh, Counts(1, 3)), bit4));
    DecodeK4Scales(b.scales, out);
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

struct Q6_KDecode {
  using Block = BlockQ6_K;
  static constexpr bool kMins32 = false, kOffsets16 = true, kMins16 = false, kSigned = false;
  static HWY_INLINE void Reorder(const BlockQ8_K& in, DecodeX* out) { ReorderNone(in, out); }
  static HWY_INLINE void Decode(const Block& b, Decoded512* out) {
    const __m512i nibble = _mm512_set1_epi8(0xF);
    const __m512i bits45 = _mm512_set1_epi8(0x30);
    for (int h = 0; h < 2; ++h) {
      // ql[64h .. 64h + 64): low nibbles = values 128h + [0, 64), high = 128h + [64, 128);
      // their bits 4-5 from qh[32h + l]: bits 0-1, 2-3 (low), 4-5, 6-7 (high).
      const __m512i q = _mm512_loadu_si512(b.ql + 64 * h);
      const __m512i hb = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h)));
      out->u[2 * h] =
          _mm512_or_si512(_mm512_and_si512(q, nibble),
                          _mm512_and_si512(_mm512_sllv_epi16(hb, Counts(4, 2)), bits45));
      out->u[2 * h + 1] =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(q, 4), nibble),
                          _mm512_and_si512(_mm512_srlv_epi16(hb, Counts(0, 2)), bits45));
    }
    // Vector j: values 64j .. 64j + 63, i16 lanes 8k .. 8k + 7 -> scale 4j + k.
    const __m256i scales16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
    const __m512i all = _mm512_castsi256_si512(scales16);
    for (int j = 0; j < 4; ++j) {
      const __m512i index = _mm512_add_epi16(
          _mm512_set1_epi16(static_cast<int16_t>(4 * j)),
          _mm512_srli_epi16(_mm512_set_epi32(0x001F001E, 0x001D001C, 0x001B001A, 0x00190018,
                                             0x00170016, 0x00150014, 0x00130012, 0x00110010,
                                             0x000F000E, 0x000D000C, 0x000B000A, 0x00090008,
                                             0x00070006, 0x00050004, 0x00030002, 0x00010000),
                            3));
      out->scales[j] = _mm512_permutexvar_epi16(index, all);
    }
    out->mins16 = _mm256_slli_epi16(scales16, 5);
    out->d = out->dmin = HalfToFloat(b.d);
  }
};

// IQ4_XS: a 512-bit load of qs holds sub-blocks 4h .. 4h + 3, one per 128-bit lane: low nibbles
// their values 0-15, high nibbles 16-31. Signed levels: |w| against x negated where w < 0.
struct IQ4_XSDecode {
  using Block = BlockIQ4_XS;
  static constexpr bool kMins32 = false, kOffsets16 = false, kMins16 = false, kSigned = true;
  // Vector 2h + k: lane s = x[128h + 32s + 16k .. + 16).
  static HWY_INLINE void Reorder(const BlockQ8_K& in, DecodeX* out) {
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 2; ++k) {
        for (int sub = 0; sub < 4; ++sub) {
          std::memcpy(out->qs + 64 * (2 * h + k) + 16 * sub, in.qs + 128 * h + 32 * sub + 16 * k,
                      16);
        }
      }
    }
  }
  static HWY_INLINE void Decode(const Block& b, Decoded512* out) {
    const __m512i table =
        _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4NLValues)));
    const __m512i nibble = _mm512_set1_epi8(0xF);
    for (int h = 0; h < 2; ++h) {
      const __m512i q = _mm512_loadu_si512(b.qs + 64 * h);
      const __m512i low = _mm512_shuffle_epi8(table, _mm512_and_si512(q, nibble));
      const __m512i high =
          _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(q, 4), nibble));
      out->u[2 * h] = _mm512_abs_epi8(low);
      out->u[2 * h + 1] = _mm512_abs_epi8(high);
      out->negative[2 * h] = _mm512_movepi8_mask(low);
      out->negative[2 * h + 1] = _mm512_movepi8_mask(high);
    }
    // Byte s = low nibble s of scales_l | bits 2s, 2s + 1 of scales_h << 4, minus 32; vector
    // 2h + k, i16 lanes 8s .. 8s + 7 -> scale 4h + s.
    const uint64_t packed = _pdep_u64(Load32(b.scales_l), 0x0F0F0F0F0F0F0F0Full) |
                            (_pdep_u64(b.scales_h, 0x0303030303030303ull) << 4);
    const __m128i scales16 = _mm_cvtepi8_epi16(
        _mm_sub_epi8(_mm_cvtsi64_si128(static_cast<int64_t>(packed)), _mm_set1_epi8(32)));
    const __m512i all = _mm512_castsi128_si512(scales16);
    for (int h = 0; h < 2; ++h) {
      const __m512i index = _mm512_add_epi16(
          _mm512_set1_epi16(static_cast<int16_t>(4 * h)),
          _mm512_srli_epi16(_mm512_set_epi32(0x001F001E, 0x001D001C, 0x001B001A, 0x00190018,
                                             0x00170016, 0x00150014, 0x00130012, 0x00110010,
                                             0x000F000E, 0x000D000C, 0x000B000A, 0x00090008,
                                             0x00070006, 0x00050004, 0x00030002, 0x00010000),
                            3));
      out->scales[2 * h] = out->scales[2 * h + 1] = _mm512_permutexvar_epi16(index, all);
    }
    out->d = HalfToFloat(b.d);
    out->dmin = 0.0f;
  }
};

// Q2_K: a 512-bit load of qs holds both 32-byte halves; bits 2k of half h are level 4h + k
// (values 128h + 32k + l). Vector k = levels k, 4 + k; i16 lanes 8t .. 8t + 7 -> sub-block
// 2k + t (t < 2) and 8 + 2k + t - 2.
struct Q2_KDecode {
  using Block = BlockQ2_K;
  static constexpr bool kMins32 = false, kOffsets16 = false, kMins16 = true, kSigned = false;
  static HWY_INLINE void Reorder(const BlockQ8_K& in, DecodeX* out) {
    for (int k = 0; k < 4; ++k) {
      std::memcpy(out->qs + 64 * k, in.qs + 32 * k, 32);
      std::memcpy(out->qs + 64 * k + 32, in.qs + 128 + 32 * k, 32);
    }
  }
  static HWY_INLINE void Decode(const Block& b, Decoded512* out) {
    const __m512i mask = _mm512_set1_epi8(3);
    const __m512i q = _mm512_loadu_si512(b.qs);
    out->u[0] = _mm512_and_si512(q, mask);
    out->u[1] = _mm512_and_si512(_mm512_srli_epi16(q, 2), mask);
    out->u[2] = _mm512_and_si512(_mm512_srli_epi16(q, 4), mask);
    out->u[3] = _mm512_and_si512(_mm512_srli_epi16(q, 6), mask);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m128i nibble = _mm_set1_epi8(0xF);
    const __m512i all = _mm512_broadcast_i32x4(_mm_and_si128(packed, nibble));
    for (int k = 0; k < 4; ++k) {
      const int a = 2 * k, c = 8 + 2 * k;
      const __m512i pattern = _mm512_inserti64x4(
          _mm512_castsi256_si512(
              _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x8000 | (a + 1))),
                               _mm_set1_epi16(static_cast<int16_t>(0x8000 | a)))),
          _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x8000 | (c + 1))),
                           _mm_set1_epi16(static_cast<int16_t>(0x8000 | c))),
          1);
      out->scales[k] = _mm512_shuffle_epi8(all, pattern);
    }
    out->mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), nibble));
    out->d = HalfToFloat(b.d);
    out->dmin = HalfToFloat(b.dmin);
  }
};

template <class Row>
struct DecodeKernel512 {
  using Block = typename Row::Block;
  const uint8_t* w;
  size_t row_bytes;
  int64_t rows, cols;
  const DecodeX* x;  // [num_x][cols / 256]
  float* y;

  template <int kW, int kX>
  HWY_INLINE void Tile(int64_t r0, int64_t x0, ColumnSlice slice) const {
    const int64_t num_blocks = cols / kQKBlock;
    const Block* w_rows[kW];
    for (int r = 0; r < kW; ++r)
      w_rows[r] = reinterpret_cast<const Block*>(w + static_cast<size_t>(r0 + r) * row_bytes);
    const DecodeX* x_rows[kX];
    for (int i = 0; i < kX; ++i) x_rows[i] = x + (x0 + i) * num_blocks;
    __m512 acc[kX][kW];
    __m128 min_acc[kX][kW];
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) {
        acc[i][r] = _mm512_setzero_ps();
        min_acc[i][r] = _mm_setzero_ps();
      }
    }
    const bool prefetch = UseRowPrefetcher(slice, cols, row_bytes);
    RowPrefetcher prefetcher(w_rows[0], kW * sizeof(Block));
    for (int64_t b = slice.begin / kQKBlock; b < slice.end / kQKBlock; ++b) {
      if (prefetch) prefetcher.Before(b);
#pragma GCC unroll 8
      for (int r = 0; r < kW; ++r) {
        Decoded512 dec;
        Row::Decode(w_rows[r][b], &dec);
#pragma GCC unroll 8
        for (int i = 0; i < kX; ++i) {
          const DecodeX& xb = x_rows[i][b];
          __m512i sum = _mm512_setzero_si512();
          for (int j = 0; j < 4; ++j) {
            __m512i xv = _mm512_load_si512(xb.qs + 64 * j);
            if constexpr (Row::kSigned)
              xv = _mm512_mask_sub_epi8(xv, dec.negative[j], _mm512_setzero_si512(), xv);
            sum = _mm512_add_epi32(
                sum, _mm512_madd_epi16(_mm512_maddubs_epi16(dec.u[j], xv), dec.scales[j]));
          }
          if constexpr (Row::kMins32) {
            const __m128i mins = _mm_madd_epi16(
                dec.mins32, _mm_load_si128(reinterpret_cast<const __m128i*>(xb.sums32)));
            acc[i][r] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dec.d * xb.d), acc[i][r]);
            min_acc[i][r] =
                _mm_fmadd_ps(_mm_cvtepi32_ps(mins), _mm_set1_ps(-dec.dmin * xb.d), min_acc[i][r]);
          } else if constexpr (Row::kOffsets16) {
            const __m256i offsets = _mm256_madd_epi16(
                dec.mins16, _mm256_load_si256(reinterpret_cast<const __m256i*>(xb.bsums)));
            sum = _mm512_sub_epi32(sum, _mm512_zextsi256_si512(offsets));
            acc[i][r] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dec.d * xb.d), acc[i][r]);
          } else if constexpr (Row::kMins16) {
            const __m256i mins = _mm256_madd_epi16(
                dec.mins16, _mm256_load_si256(reinterpret_cast<const __m256i*>(xb.bsums)));
            acc[i][r] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dec.d * xb.d), acc[i][r]);
            acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_zextsi256_si512(mins)),
                                        _mm512_set1_ps(-dec.dmin * xb.d), acc[i][r]);
          } else {
            acc[i][r] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dec.d * xb.d), acc[i][r]);
          }
        }
      }
    }
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r) {
        float value = _mm512_reduce_add_ps(acc[i][r]);
        if constexpr (Row::kMins32) {
          alignas(16) float m[4];
          _mm_store_ps(m, min_acc[i][r]);
          value += (m[0] + m[1]) + (m[2] + m[3]);
        }
        StoreOutput(&y[(x0 + i) * rows + r0 + r], value, slice.accumulate);
      }
    }
  }
};

template <class Row>
void MatmulDecode512(const MatrixView& w, const BlockQ8_K* xq, int64_t num_x, float* y,
                     ThreadPool& pool) {
  const int64_t num_blocks = w.cols / kQKBlock;
  std::vector<DecodeX> xd(static_cast<size_t>(num_x * num_blocks));
  for (int64_t k = 0; k < num_x * num_blocks; ++k) {
    const BlockQ8_K& in = xq[k];
    DecodeX& out = xd[static_cast<size_t>(k)];
    Row::Reorder(in, &out);
    for (int s = 0; s < 16; ++s) out.bsums[s] = in.bsums[s];
    for (int g = 0; g < 8; ++g)
      out.sums32[g] = static_cast<int16_t>(in.bsums[2 * g] + in.bsums[2 * g + 1]);
    out.d = in.d;
  }
  const DecodeKernel512<Row> kernel{static_cast<const uint8_t*>(w.data),
                                    row_bytes(w.dtype, w.cols),
                                    w.rows,
                                    w.cols,
                                    xd.data(),
                                    y};
  Run(kernel, num_x, pool);
}

template <class Unpack>
struct Decode512Of {
  using type = void;
};
template <>
struct Decode512Of<Q4_KUnpack> {
  using type = Q4_KDecode;
};
template <>
struct Decode512Of<Q5_KUnpack> {
  using type = Q5_KDecode;
};
template <>
struct Decode512Of<Q6_KUnpack> {
  using type = Q6_KDecode;
};
template <>
struct Decode512Of<Q2_KUnpack> {
  using type = Q2_KDecode;
};
template <>
struct Decode512Of<IQ4_XSUnpack> {
  using type = IQ4_XSDecode;
};
#endif  // HWY_TARGET <= HWY_AVX3

#if HWY_TARGET == HWY_AVX3
// Prefill on CPUs with AVX-512 VNNI (vnni::supported()): tasks of whole 16-row groups. Per group
// and slice of kVnniSliceBlocks super-blocks, the 16 rows are unpacked once (as above), their
// levels transposed into the tile layout of matmul_super_blocks_vnni.h (u8, 4 columns of all 16
// rows per 64 bytes) and their scales (and mins) expanded to f32 per row; then every activation
// row runs over the tile there. ~2 KiB of weights per 16 x 256 tile, decoded once per matmul.
inline constexpr int64_t kVnniSliceBlocks = 4;  // 1024 columns: 16 KiB of levels, in L1

template <class Row>
struct SuperBlockVnniKernel {
  static constexpr int64_t kRowAlign = 16;
  using Block = typename Row::Block;
  static constexpr int kGroups = kQKBlock / Row::kGroupCols;
  const uint8_t* w;
  size_t row_bytes;
  int64_t rows, cols;
  vnni::SuperBlockActivations x;
  float* y;

  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    alignas(64) uint8_t row_levels[16][kVnniSliceBlocks * kQKBlock];
    alignas(64) uint8_t levels[kVnniSliceBlocks * kQKBlock * 16];
    alignas(64) float scales[kVnniSliceBlocks * kGroups * 16];
    alignas(64) float mins[kVnniSliceBlocks * kGroups * 16];
    const int64_t num_blocks = cols / kQKBlock;
    for (int64_t r0 = r_begin; r0 < r_end; r0 += 16) {
      const int num_rows = static_cast<int>(std::min<int64_t>(16, rows - r0));
      for (int64_t b0 = 0; b0 < num_blocks; b0 += kVnniSliceBlocks) {
        const int64_t slice_blocks = std::min(kVnniSliceBlocks, num_blocks - b0);
        for (int r = 0; r < 16; ++r) {
          if (r >= num_rows) {
            std::memset(row_levels[r], 0, sizeof(row_levels[r]));
            for (int64_t g = 0; g < slice_blocks * kGroups; ++g)
              scales[g * 16 + r] = mins[g * 16 + r] = 0.0f;
            continue;
          }
          const Block* row =
              reinterpret_cast<const Block*>(w + static_cast<size_t>(r0 + r) * row_bytes);
          for (int64_t sb = 0; sb < slice_blocks; ++sb) {
            Unpacked unpacked;
            Row::Unpack(row[b0 + sb], &unpacked);
            uint8_t* out = row_levels[r] + sb * kQKBlock;
            for (int v = 0; v < 8; ++v) {
              __m256i level = unpacked.u[v];
              if constexpr (Row::kSigned)
                level = _mm256_xor_si256(unpacked.sign[v], _mm256_set1_epi8(-128));
              _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * v), level);
            }
            // Scale of 16-column group 2v in i16 lane 0 of scales[v], of 2v + 1 in lane 8.
            alignas(32) int16_t scale16[8][16];
            alignas(32) int16_t min16[16];
            for (int v = 0; v < 8; ++v)
              _mm256_store_si256(reinterpret_cast<__m256i*>(scale16[v]), unpacked.scales[v]);
            _mm256_store_si256(reinterpret_cast<__m256i*>(min16), unpacked.mins);
            for (int g = 0; g < kGroups; ++g) {
              const int16_t scale =
                  Row::kGroupCols == 32 ? scale16[g][0] : scale16[g / 2][8 * (g % 2)];
              const int16_t min = Row::kGroupCols == 32 ? min16[2 * g] : min16[g];
              scales[(sb * kGroups + g) * 16 + r] = unpacked.d * scale;
              mins[(sb * kGroups + g) * 16 + r] = unpacked.dmin * min;
            }
          }
        }
        // levels[k][r] = row_levels[r][4k .. 4k + 3]: 16 x 16 transposes of 4-byte groups.
        for (int64_t chunk = 0; chunk < slice_blocks * kQKBlock / 64; ++chunk) {
          __m512i rows16[16];
          for (int r = 0; r < 16; ++r) rows16[r] = _mm512_load_si512(row_levels[r] + 64 * chunk);
          Transpose16x16(rows16, levels + chunk * 16 * 64);
        }
        const vnni::SuperBlockTile tile{levels, scales, Row::kHasMins ? mins : nullptr,
                                        Row::kGroupCols, slice_blocks};
        vnni::super_block_tile(tile, x, b0, num_x, y + r0, rows, num_rows, b0 != 0);
      }
    }
  }
};

// The activation side of the VNNI tiles: per row and column group, -offset * sum(q_x) and
// -sum(q_x) (from the Q8_K sums per 16).
template <class Row>
struct GroupSums {
  std::vector<int32_t> offset_sums;
  std::vector<float> neg_sums;
  int64_t groups_per_row;

  GroupSums(const BlockQ8_K* xq, int64_t num_x, int64_t cols)
      : offset_sums(static_cast<size_t>(num_x * (cols / Row::kGroupCols))),
        neg_sums(offset_sums.size()),
        groups_per_row(cols / Row::kGroupCols) {
    constexpr int kPerGroup = Row::kGroupCols / 16;
    const int64_t num_blocks = cols / kQKBlock;
    for (int64_t i = 0; i < num_x; ++i) {
      for (int64_t b = 0; b < num_blocks; ++b) {
        const BlockQ8_K& block = xq[i * num_blocks + b];
        for (int g = 0; g < kQKBlock / Row::kGroupCols; ++g) {
          int32_t sum = 0;
          for (int k = 0; k < kPerGroup; ++k) sum += block.bsums[g * kPerGroup + k];
          const size_t at =
              static_cast<size_t>(i * groups_per_row + b * (kQKBlock / Row::kGroupCols) + g);
          offset_sums[at] = -Row::kLevelOffset * sum;
          neg_sums[at] = static_cast<float>(-sum);
        }
      }
    }
  }
  vnni::SuperBlockActivations activations(const BlockQ8_K* xq, int64_t cols) const {
    return {xq, cols / kQKBlock, offset_sums.data(), neg_sums.data(), groups_per_row};
  }
};

template <class Row>
void MatmulVnni(const MatrixView& w, const BlockQ8_K* xq, int64_t num_x, float* y,
                ThreadPool& pool) {
  const GroupSums<Row> sums(xq, num_x, w.cols);
  const SuperBlockVnniKernel<Row> kernel{static_cast<const uint8_t*>(w.data),
                                         row_bytes(w.dtype, w.cols),
                                         w.rows,
                                         w.cols,
                                         sums.activations(xq, w.cols),
                                         y};
  Run(kernel, num_x, pool);
}

// The K-quants and IQ4_XS packed by pack_for_matmul(), any number of activation rows: tasks of
// whole 16-row groups.
struct PackedSuperBlockVnniKernel {
  static constexpr int64_t kRowAlign = 16;
  DType dtype;
  const uint8_t* packed;
  size_t row_bytes;  // of the unpacked rows: Run sizes its tasks by them
  int64_t rows, cols;
  vnni::SuperBlockActivations x;
  float* y;
  void Rows(int64_t r_begin, int64_t r_end, int64_t num_x) const {
    vnni::packed_super_block_groups(dtype, packed, rows, cols, x, y, r_begin / kRowAlign,
                                    (r_end + kRowAlign - 1) / kRowAlign, num_x);
  }
};

template <class Row>
void MatmulPacked(const MatrixView& w, const BlockQ8_K* xq, int64_t num_x, float* y,
                  ThreadPool& pool) {
  const GroupSums<Row> sums(xq, num_x, w.cols);
  const PackedSuperBlockVnniKernel kernel{w.dtype, packed_bytes(w), row_bytes(w.dtype, w.cols),
                                          w.rows,  w.cols,          sums.activations(xq, w.cols),
                                          y};
  Run(kernel, num_x, pool);
}
#endif

template <class Row>
void MatmulWith(const MatrixView& w, const BlockQ8_K* xq, int64_t num_x, float* y,
                ThreadPool& pool) {
#if HWY_TARGET == HWY_AVX3
  // Every super-block type is packed (pack_for_matmul) where the CPU has VNNI.
  if (packed_bytes(w) != nullptr && vnni::supported())
    return MatmulPacked<Row>(w, xq, num_x, y, pool);
  if (num_x >= kVnniMinRows && vnni::supported()) return MatmulVnni<Row>(w, xq, num_x, y, pool);
#endif
#if HWY_TARGET <= HWY_AVX3
  using Decode = typename Decode512Of<Row>::type;
  if constexpr (!std::is_void_v<Decode>) {
    if (num_x < kVnniMinRows) return MatmulDecode512<Decode>(w, xq, num_x, y, pool);
  }
#endif
  const SuperBlockKernel<Row> kernel{
      static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, w.cols), w.rows, w.cols, xq, y};
  Run(kernel, num_x, pool);
}

void MatmulQ8_K(const MatrixView& w, const BlockQ8_K* xq, int64_t num_x, float* y,
                ThreadPool& pool) {
  switch (w.dtype) {
    case DType::kQ2_K:
      return MatmulWith<Q2_KUnpack>(w, xq, num_x, y, pool);
    case DType::kQ3_K:
      return MatmulWith<Q3_KUnpack>(w, xq, num_x, y, pool);
    case DType::kQ4_K:
      return MatmulWith<Q4_KUnpack>(w, xq, num_x, y, pool);
    case DType::kQ5_K:
      return MatmulWith<Q5_KUnpack>(w, xq, num_x, y, pool);
    case DType::kQ6_K:
      return MatmulWith<Q6_KUnpack>(w, xq, num_x, y, pool);
    case DType::kIQ4_XS:
      return MatmulWith<IQ4_XSUnpack>(w, xq, num_x, y, pool);
    default:
      return;
  }
}

#else  // portable targets

// Any super-block type against Q8_K through the scalar decoding: integer sums per 16 values.
struct PortableSuperBlockKernel {
  DType dtype;
  const uint8_t* w;
  size_t row_bytes;
  int64_t rows, cols;
  const BlockQ8_K* x;
  float* y;

  template <int kW, int kX>
  HWY_INLINE void Tile(int64_t r0, int64_t x0, ColumnSlice slice) const {
    const int64_t num_blocks = cols / kQKBlock;
    const size_t block = block_bytes(dtype);
    float acc[kX][kW] = {};
    quant::SuperBlockInts ints;
    for (int64_t b = slice.begin / kQKBlock; b < slice.end / kQKBlock; ++b) {
      for (int r = 0; r < kW; ++r) {
        quant::decode_super_block(dtype, w + static_cast<size_t>(r0 + r) * row_bytes + b * block,
                                  &ints);
        for (int i = 0; i < kX; ++i) {
          const BlockQ8_K& xb = x[(x0 + i) * num_blocks + b];
          int32_t sum = 0, sum_min = 0;
          for (int s = 0; s < kQKBlock / 16; ++s) {
            int32_t dot = 0;
            for (int j = 16 * s; j < 16 * s + 16; ++j) dot += ints.q[j] * xb.qs[j];
            sum += ints.scales[s] * dot;
            sum_min += ints.mins[s] * xb.bsums[s];
          }
          acc[i][r] += ints.d * xb.d * static_cast<float>(sum) -
                       ints.dmin * xb.d * static_cast<float>(sum_min);
        }
      }
    }
    for (int i = 0; i < kX; ++i) {
      for (int r = 0; r < kW; ++r)
        StoreOutput(&y[(x0 + i) * rows + r0 + r], acc[i][r], slice.accumulate);
    }
  }
};

void MatmulQ8_K(const MatrixView& w, const BlockQ8_K* xq, int64_t num_x, float* y,
                ThreadPool& pool) {
  const PortableSuperBlockKernel kernel{
      w.dtype, static_cast<const uint8_t*>(w.data), row_bytes(w.dtype, w.cols), w.rows, w.cols, xq,
      y};
  Run(kernel, num_x, pool);
}

#endif

// x -> Q8_K (num_x * cols / 256 blocks of 292 bytes; parallel over x rows when there are
// many), then the per-target kernel.
void MatmulSuperBlock(const MatrixView& w, const float* x, int64_t num_x, float* y,
                      ThreadPool& pool) {
  const int64_t num_blocks = w.cols / kQKBlock;
  std::vector<BlockQ8_K> xq(static_cast<size_t>(num_x * num_blocks));
  const auto quantize_rows = [&](int64_t begin, int64_t end) HWY_ATTR {
    for (int64_t i = begin; i < end; ++i)
      QuantizeRowQ8_K(x + i * w.cols, num_blocks, xq.data() + i * num_blocks);
  };
  if (num_x > 1 && pool.num_threads() > 1 && num_x * w.cols >= kMinParallelQuantize) {
    pool.parallel_for(num_x, quantize_rows);
  } else {
    quantize_rows(0, num_x);
  }
  MatmulQ8_K(w, xq.data(), num_x, y, pool);
}

}  // namespace sieve::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "kernels/cpu/matmul_quant_types.h"

namespace sieve::kernels {

HWY_EXPORT(MatmulSuperBlock);

void matmul_super_block(const MatrixView& w, const float* x, int64_t num_x, float* y,
                        ThreadPool& pool) {
  HWY_DYNAMIC_DISPATCH(MatmulSuperBlock)(w, x, num_x, y, pool);
}

}  // namespace sieve::kernels
#endif  // HWY_ONCE
