// Q8_0 x Q8_0 matmul tiles with AVX-512 VNNI. See matmul_vnni.h; the portable kernels are in
// matmul-inl.h, the scalar reference in ref/ref_ops.cc.
//
// vpdpbusd multiplies unsigned by signed bytes, and both operands are signed here. The
// activations go in as u = x + 128 (x in [-127, 127], so u in [1, 255]); then
//   sum_j u_j w_j = sum_j x_j w_j + 128 sum_j w_j,
// and the second term, computed once per weight block with one more vpdpbusd (128 * w),
// starts each int32 lane negated: every lane ends with its exact share of sum_j x_j w_j.
// One 512-bit vector holds two 32-value blocks (int32 lanes 0-7 block b, 8-15 block b + 1),
// whose scales d_w * d_x are spread the same way.
//
// Per tile of kW weight rows x kX activation rows and block pair: kW weight loads, kX
// activation loads, kW correction products, and kW * kX (vpdpbusd, convert, scale, FMA).
// Loop order: column slices of kSliceCols, weight tiles, activation tiles: each weight tile
// comes from memory once (prefetched one tile ahead) and stays in L1 while every activation
// tile of the slice passes over it; the slice of all activations stays in L2.
#include "kernels/cpu/matmul_vnni.h"

#include <algorithm>

#include "kernels/blocks.h"
#include "kernels/cpu/vnni_common.h"

namespace sieve::kernels::vnni {

#if SIEVE_VNNI

bool supported() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

namespace {

inline constexpr int64_t kPackedBlockBytes = 32 + 16 * kQBlock;  // 16 f16 scales, 16 x 32 bytes
inline constexpr int kRowsW = 4;  // 4 x 4 accumulators + 4 activation vectors + 4 scales
inline constexpr int kRowsX = 4;
inline constexpr int64_t kSliceBlocks = 32;  // 1024 columns: 4 activation rows = 4 KiB in L1

// The activations of rows [x0, x0 + kX) times the weights of rows [r0, r0 + kW), over the
// slice's blocks.
template <int kW, int kX>
SIEVE_VNNI_ATTR inline void Tile(const Q8_0Problem& p, int64_t r0, int64_t x0, const Slice& s) {
  const int64_t num_blocks = p.cols / kQBlock;
  const BlockQ8_0* w[kW];
  for (int r = 0; r < kW; ++r)
    w[r] = reinterpret_cast<const BlockQ8_0*>(p.w + (r0 + r) * p.row_bytes);
  const int8_t* xq[kX];
  const float* xd[kX];
  for (int i = 0; i < kX; ++i) {
    xq[i] = p.xq + (x0 + i) * p.cols;
    xd[i] = p.xd + (x0 + i) * num_blocks;
  }
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));  // +128 as u8, w * 128 as s8
  const __m512i zero = _mm512_setzero_si512();
  __m512 acc[kW][kX];
  for (int r = 0; r < kW; ++r) {
    for (int i = 0; i < kX; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  // One step: xu / xs of kX rows, wv and its scale pair for kW rows.
  const auto step = [&](const __m512i* xu, const __m512* xs, int64_t b, bool pair) SIEVE_VNNI_ATTR {
    for (int r = 0; r < kW; ++r) {
      const BlockQ8_0* block = w[r] + b;
      const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block[0].qs));
      __m512i wv;
      uint32_t scales = block[0].d;
      if (pair) {
        wv = _mm512_inserti64x4(_mm512_zextsi256_si512(low),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block[1].qs)),
                                1);
        scales |= static_cast<uint32_t>(block[1].d) << 16;
      } else {
        wv = _mm512_zextsi256_si512(low);
      }
      const __m512i neg_offset = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, bias, wv));
      const __m512 ws = SpreadPair(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(scales))));
      for (int i = 0; i < kX; ++i) {
        const __m512i dot = _mm512_dpbusd_epi32(neg_offset, xu[i], wv);
        acc[r][i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(ws, xs[i]), acc[r][i]);
      }
    }
  };
  int64_t b = s.begin;
  for (; b + 2 <= s.end; b += 2) {
    __m512i xu[kX];
    __m512 xs[kX];
    for (int i = 0; i < kX; ++i) {
      xu[i] = _mm512_xor_si512(_mm512_loadu_si512(xq[i] + b * kQBlock), bias);
      xs[i] = SpreadPair(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(xd[i] + b))));
    }
    step(xu, xs, b, true);
  }
  if (b < s.end) {  // one block left: the upper lanes see w = 0 and scale 0
    __m512i xu[kX];
    __m512 xs[kX];
    for (int i = 0; i < kX; ++i) {
      xu[i] = _mm512_xor_si512(_mm512_zextsi256_si512(_mm256_loadu_si256(
                                   reinterpret_cast<const __m256i*>(xq[i] + b * kQBlock))),
                               bias);
      xs[i] = SpreadPair(_mm_load_ss(xd[i] + b));
    }
    step(xu, xs, b, false);
  }
  for (int r = 0; r < kW; ++r) {
    for (int i = 0; i < kX; ++i) {
      float* out = &p.y[(x0 + i) * p.rows + r0 + r];
      const float value = _mm512_reduce_add_ps(acc[r][i]);
      *out = s.accumulate ? *out + value : value;
    }
  }
}

// Weight rows [r0, r0 + kW) against every activation row.
template <int kW>
SIEVE_VNNI_ATTR inline void WeightTile(const Q8_0Problem& p, int64_t r0, int64_t num_x,
                                       const Slice& s) {
  int64_t x0 = 0;
  for (; x0 + kRowsX <= num_x; x0 += kRowsX) Tile<kW, kRowsX>(p, r0, x0, s);
  switch (num_x - x0) {
    case 3:
      Tile<kW, 3>(p, r0, x0, s);
      break;
    case 2:
      Tile<kW, 2>(p, r0, x0, s);
      break;
    case 1:
      Tile<kW, 1>(p, r0, x0, s);
      break;
    default:
      break;
  }
}

// The slice's bytes of weight rows [r0, r1) into L1, ahead of use.
SIEVE_VNNI_ATTR inline void PrefetchRows(const Q8_0Problem& p, int64_t r0, int64_t r1,
                                         const Slice& s) {
  for (int64_t r = r0; r < r1; ++r) {
    const char* row = reinterpret_cast<const char*>(p.w + r * p.row_bytes);
    const char* end = row + s.end * sizeof(BlockQ8_0);
    for (const char* line = row + s.begin * sizeof(BlockQ8_0); line < end; line += 64)
      _mm_prefetch(line, _MM_HINT_T0);
  }
}

// 16 weight rows (group g) x kX activation rows [x0, x0 + kX), all blocks.
template <int kX>
SIEVE_VNNI_ATTR inline void PackedTile(const PackedQ8_0Problem& p, int64_t g, int64_t x0) {
  const int64_t num_blocks = p.cols / kQBlock;
  const uint8_t* group = p.packed + g * num_blocks * kPackedBlockBytes;
  __m512 acc[kX];
  for (int i = 0; i < kX; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block = group + b * kPackedBlockBytes;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block)));
    __m512i w[8];
    for (int k = 0; k < 8; ++k) w[k] = _mm512_loadu_si512(block + 32 + 64 * k);
    for (int i = 0; i < kX; ++i) {
      const int64_t xb = (x0 + i) * num_blocks + b;
      const int8_t* xq = p.xq + xb * kQBlock;
      __m512i dot = _mm512_set1_epi32(p.xsum[xb]);
      for (int k = 0; k < 8; ++k) dot = DpbusdBroadcast(dot, w[k], xq + 4 * k);
      acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw, _mm512_set1_ps(p.xd[xb])),
                               acc[i]);
    }
  }
  const int64_t r0 = g * 16;
  const __mmask16 rows =
      p.rows - r0 >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (p.rows - r0)) - 1);
  for (int i = 0; i < kX; ++i) _mm512_mask_storeu_ps(p.y + (x0 + i) * p.rows + r0, rows, acc[i]);
}

}  // namespace

SIEVE_VNNI_ATTR void packed_q8_0_groups(const PackedQ8_0Problem& p, int64_t g_begin, int64_t g_end,
                                        int64_t num_x) {
  constexpr int kX = 8;  // 8 weight + 8 accumulator registers, 8 independent vpdpbusd chains
  for (int64_t g = g_begin; g < g_end; ++g) {
    int64_t x0 = 0;
    for (; x0 + kX <= num_x; x0 += kX) PackedTile<kX>(p, g, x0);
    switch (num_x - x0) {
      case 7:
        PackedTile<7>(p, g, x0);
        break;
      case 6:
        PackedTile<6>(p, g, x0);
        break;
      case 5:
        PackedTile<5>(p, g, x0);
        break;
      case 4:
        PackedTile<4>(p, g, x0);
        break;
      case 3:
        PackedTile<3>(p, g, x0);
        break;
      case 2:
        PackedTile<2>(p, g, x0);
        break;
      case 1:
        PackedTile<1>(p, g, x0);
        break;
      default:
        break;
    }
  }
}

SIEVE_VNNI_ATTR void q8_0_rows(const Q8_0Problem& p, int64_t r_begin, int64_t r_end,
                               int64_t num_x) {
  const int64_t num_blocks = p.cols / kQBlock;
  for (int64_t b0 = 0; b0 < num_blocks; b0 += kSliceBlocks) {
    const Slice s{b0, std::min(num_blocks, b0 + kSliceBlocks), b0 != 0};
    int64_t r = r_begin;
    for (; r + kRowsW <= r_end; r += kRowsW) {
      PrefetchRows(p, r + kRowsW, std::min(r_end, r + 2 * kRowsW), s);
      WeightTile<kRowsW>(p, r, num_x, s);
    }
    for (; r < r_end; ++r) WeightTile<1>(p, r, num_x, s);
  }
}

#else  // not x86-64 with GCC/Clang

bool supported() { return false; }
void q8_0_rows(const Q8_0Problem&, int64_t, int64_t, int64_t) {}
void packed_q8_0_groups(const PackedQ8_0Problem&, int64_t, int64_t, int64_t) {}

#endif

}  // namespace sieve::kernels::vnni
