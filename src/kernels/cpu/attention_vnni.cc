// Paged attention on Q8_0 / Q4_1 K/V tiles with AVX-512 VNNI: see attention_vnni.h; the portable
// path is cpu/attention-inl.h (tiles dequantized to f32), the reference paged_attention_ref.cc.
#include "kernels/cpu/attention_vnni.h"

#include <algorithm>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/cpu/vnni_common.h"

namespace sieve::kernels::vnni {

namespace {

inline constexpr int64_t kMaxKeys = 64;  // keys per tile at most (attention-inl.h's kVnniTileKeys)
inline constexpr int kMaxChunks = kMaxKeys / 16;

struct Layout {
  int64_t block_bytes;  // 34 (Q8_0) / 20 (Q4_1)
  int64_t qs_offset;    // the quants' offset in a block
};
inline Layout LayoutOf(KvBlockFormat format) {
  return format == KvBlockFormat::kQ8_0 ? Layout{34, 2} : Layout{20, 4};
}

}  // namespace

// A prepared query vector: its head_dim int8 values, then per block its f32 d and correction
// (Q8_0: int32 128 * sum q, the K bytes' bias; Q4_1: f32 d * sum q, for the K minimum), padded
// to a cache line.
inline int64_t VecBytes(int64_t head_dim) {
  return (head_dim + head_dim / kQBlock * 8 + 63) / 64 * 64;
}

size_t attn_query_set_bytes(int64_t head_dim) {
  return static_cast<size_t>(4 * VecBytes(head_dim));
}

void attn_prepare_queries(KvBlockFormat format, const int8_t* q, const float* d, int64_t count,
                          int64_t head_dim, uint8_t* sets) {
  const int64_t num_blocks = head_dim / kQBlock;
  const int64_t vec_bytes = VecBytes(head_dim);
  for (int64_t v = 0; v < count; ++v) {
    uint8_t* out = sets + v * vec_bytes;
    const int8_t* row = q + v * head_dim;
    std::memcpy(out, row, static_cast<size_t>(head_dim));
    for (int64_t b = 0; b < num_blocks; ++b) {
      int32_t sum = 0;
      for (int64_t i = 0; i < kQBlock; ++i) sum += row[b * kQBlock + i];
      const float dq = d[v * num_blocks + b];
      uint8_t* scales = out + head_dim + 8 * b;
      std::memcpy(scales, &dq, 4);
      if (format == KvBlockFormat::kQ8_0) {  // K bytes biased by 128: subtract 128 * sum q
        const int32_t bias = 128 * sum;
        std::memcpy(scales + 4, &bias, 4);
      } else {  // Q4_1's minimum: m_k * (d_q * sum q)
        const float corr = dq * static_cast<float>(sum);
        std::memcpy(scales + 4, &corr, 4);
      }
    }
  }
}

#if SIEVE_VNNI

namespace {

// The 4 bytes at `offset` of rows[0..3] (a block's f16 d, and Q4_1's m after it) as the 4
// dwords of an xmm, straight into a register (no gather: slow on Zen 4; no scalar stores read
// back as a vector: they stall on store forwarding).
SIEVE_VNNI_ATTR inline __m128i Words4(const uint8_t* const* rows, int64_t offset) {
  uint32_t w[4];
  for (int j = 0; j < 4; ++j) std::memcpy(&w[j], rows[j] + offset, 4);
  __m128i x = _mm_cvtsi32_si128(static_cast<int>(w[0]));
  x = _mm_insert_epi32(x, static_cast<int>(w[1]), 1);
  x = _mm_insert_epi32(x, static_cast<int>(w[2]), 2);
  return _mm_insert_epi32(x, static_cast<int>(w[3]), 3);
}

// d (and Q4_1's m) at byte `offset` of rows[0..32) as f32 arrays d[32], m[32].
SIEVE_VNNI_ATTR inline void BlockScales(const uint8_t* const* rows, int64_t n, int64_t offset,
                                        float* d, float* m) {
  for (int64_t j = 0; j < n; j += 16) {
    __m512i x = _mm512_castsi128_si512(Words4(rows + j, offset));
    x = _mm512_inserti32x4(x, Words4(rows + j + 4, offset), 1);
    x = _mm512_inserti32x4(x, Words4(rows + j + 8, offset), 2);
    x = _mm512_inserti32x4(x, Words4(rows + j + 12, offset), 3);
    _mm512_store_ps(d + j, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(x)));
    if (m != nullptr) {
      _mm512_store_ps(m + j, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(x, 16))));
    }
  }
}

// The 16-byte pieces at offset `at` of 4 rows, chunk j = row j.
SIEVE_VNNI_ATTR inline __m512i Load4(const uint8_t* const* rows, int64_t at) {
  __m512i x =
      _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[0] + at)));
  x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[1] + at)), 1);
  x = _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[2] + at)), 2);
  return _mm512_inserti32x4(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[3] + at)), 3);
}

// y[g] lane 4 c + r = dword g of x[r]'s chunk c (a 4 x 4 dword transpose in every 128-bit chunk).
SIEVE_VNNI_ATTR inline void Transpose4(const __m512i* x, __m512i* y) {
  const __m512i t0 = _mm512_unpacklo_epi32(x[0], x[1]), t1 = _mm512_unpackhi_epi32(x[0], x[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(x[2], x[3]), t3 = _mm512_unpackhi_epi32(x[2], x[3]);
  y[0] = _mm512_unpacklo_epi64(t0, t2);
  y[1] = _mm512_unpackhi_epi64(t0, t2);
  y[2] = _mm512_unpacklo_epi64(t1, t3);
  y[3] = _mm512_unpackhi_epi64(t1, t3);
}

// Scores of kR query vectors (prepared, at q, vec_bytes apart) against the 16 keys whose K
// bytes kv holds (lane j = key j: kv[8 b + g] = dword g of block b, as u8) with scales dk / mk
// (lane j: key j's d, and Q4_1's m, of block b at [16 b]); s[r * tp + j] for j < 16.
template <int kR, KvBlockFormat kFormat>
SIEVE_VNNI_ATTR inline void ScoreRows(const __m512i* kv, const float* dk, const float* mk,
                                      int64_t num_blocks, const uint8_t* q, int64_t vec_bytes,
                                      int64_t head_dim, float* s, int64_t tp) {
  __m512 score[kR];
  for (int r = 0; r < kR; ++r) score[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    __m512i acc[kR];
    for (int r = 0; r < kR; ++r) acc[r] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      const __m512i k = _mm512_load_si512(kv + 8 * b + g);
      for (int r = 0; r < kR; ++r) {
        const auto* word = reinterpret_cast<const int8_t*>(q + r * vec_bytes + b * kQBlock + 4 * g);
        acc[r] = DpbusdBroadcast(acc[r], k, word);
      }
    }
    const __m512 d = _mm512_load_ps(dk + 16 * b);
    for (int r = 0; r < kR; ++r) {
      const uint8_t* scales = q + r * vec_bytes + head_dim + 8 * b;
      float dq;
      std::memcpy(&dq, scales, 4);
      const __m512 w = _mm512_mul_ps(d, _mm512_set1_ps(dq));
      if constexpr (kFormat == KvBlockFormat::kQ8_0) {
        int32_t bias;
        std::memcpy(&bias, scales + 4, 4);
        score[r] = _mm512_fmadd_ps(
            _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r], _mm512_set1_epi32(bias))), w, score[r]);
      } else {
        float corr;
        std::memcpy(&corr, scales + 4, 4);
        score[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), w, score[r]);
        score[r] = _mm512_fmadd_ps(_mm512_load_ps(mk + 16 * b), _mm512_set1_ps(corr), score[r]);
      }
    }
  }
  for (int r = 0; r < kR; ++r) _mm512_storeu_ps(s + r * tp, score[r]);
}

// Per 16 keys, their K bytes are transposed once into vectors with one key per lane (per dword
// g of a block: 4 Load4 of 4 rows, one 4 x 4 transpose), then every query vector takes 8
// vpdpbusd per block with its dword g broadcast.
template <KvBlockFormat kFormat>
SIEVE_VNNI_ATTR void Scores(const uint8_t* sets, int64_t count, int64_t head_dim,
                            const uint8_t* const* k_rows, int64_t num_keys, float* s, int64_t tp) {
  constexpr Layout kLayout = kFormat == KvBlockFormat::kQ8_0 ? Layout{34, 2} : Layout{20, 4};
  const int64_t num_blocks = head_dim / kQBlock;  // <= 8
  const int64_t vec_bytes = VecBytes(head_dim);
  alignas(64) __m512i kv[8 * 8];
  alignas(64) float dk[8 * 16], mk[8 * 16];
  for (int64_t j0 = 0; j0 < num_keys; j0 += 16) {
    const int64_t n = std::min<int64_t>(16, num_keys - j0);
    const uint8_t* rows[16];    // padded with the last key
    const uint8_t* rows_t[16];  // rows_t[4 r + c] = rows[4 c + r]: Transpose4 gives lane j = key j
    for (int64_t j = 0; j < 16; ++j) rows[j] = k_rows[j0 + std::min(j, n - 1)];
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 4; ++c) rows_t[4 * r + c] = rows[4 * c + r];
    }
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t at = b * kLayout.block_bytes + kLayout.qs_offset;
      __m512i x[4];
      if constexpr (kFormat == KvBlockFormat::kQ8_0) {
        const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
        for (int h = 0; h < 2; ++h) {
          for (int r = 0; r < 4; ++r)
            x[r] = _mm512_xor_si512(Load4(rows_t + 4 * r, at + 16 * h), bias);
          Transpose4(x, kv + 8 * b + 4 * h);
        }
      } else {
        const __m512i low = _mm512_set1_epi8(0x0F);
        for (int r = 0; r < 4; ++r) x[r] = Load4(rows_t + 4 * r, at);
        __m512i packed[4];
        Transpose4(x, packed);
        for (int g = 0; g < 4; ++g) {
          kv[8 * b + g] = _mm512_and_si512(packed[g], low);
          kv[8 * b + 4 + g] = _mm512_and_si512(_mm512_srli_epi16(packed[g], 4), low);
        }
      }
      BlockScales(rows, 16, b * kLayout.block_bytes, dk + 16 * b,
                  kFormat == KvBlockFormat::kQ4_1 ? mk + 16 * b : nullptr);
    }
    for (int64_t m = 0; m < count; m += 4) {
      const uint8_t* q = sets + m * vec_bytes;
      float* out = s + m * tp + j0;
      switch (std::min<int64_t>(4, count - m)) {
        case 1:
          ScoreRows<1, kFormat>(kv, dk, mk, num_blocks, q, vec_bytes, head_dim, out, tp);
          break;
        case 2:
          ScoreRows<2, kFormat>(kv, dk, mk, num_blocks, q, vec_bytes, head_dim, out, tp);
          break;
        case 3:
          ScoreRows<3, kFormat>(kv, dk, mk, num_blocks, q, vec_bytes, head_dim, out, tp);
          break;
        default:
          ScoreRows<4, kFormat>(kv, dk, mk, num_blocks, q, vec_bytes, head_dim, out, tp);
          break;
      }
    }
  }
}

// P·V for kR query vectors and the kB blocks from block b0 (kB * 32 columns).
template <int kR, int kB, KvBlockFormat kFormat>
SIEVE_VNNI_ATTR inline void PvPass(const float* pd, const float* msum, int64_t num_blocks,
                                   const float* alpha, const uint8_t* const* v_rows,
                                   int64_t num_keys, int64_t b0, float* acc, int64_t dp) {
  constexpr Layout kLayout = kFormat == KvBlockFormat::kQ8_0 ? Layout{34, 2} : Layout{20, 4};
  __m512 a[kR][2 * kB];
  for (int r = 0; r < kR; ++r) {
    const __m512 scale = _mm512_set1_ps(alpha[r]);
    for (int c = 0; c < 2 * kB; ++c) {
      a[r][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + r * dp + b0 * kQBlock + 16 * c), scale);
    }
  }
  for (int64_t j = 0; j < num_keys; ++j) {
    __m512 v[2 * kB];
    for (int bi = 0; bi < kB; ++bi) {
      const uint8_t* qs = v_rows[j] + (b0 + bi) * kLayout.block_bytes + kLayout.qs_offset;
      if constexpr (kFormat == KvBlockFormat::kQ8_0) {
        v[2 * bi] = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
        v[2 * bi + 1] = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
      } else {
        const __m512i x =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
        v[2 * bi] = _mm512_cvtepi32_ps(_mm512_and_si512(x, _mm512_set1_epi32(0xF)));
        v[2 * bi + 1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 4));
      }
    }
    for (int r = 0; r < kR; ++r) {
      for (int bi = 0; bi < kB; ++bi) {
        const float* w = pd + (r * num_blocks + b0 + bi) * kMaxKeys + j;
        a[r][2 * bi] = FmaddBroadcast(a[r][2 * bi], v[2 * bi], w);
        a[r][2 * bi + 1] = FmaddBroadcast(a[r][2 * bi + 1], v[2 * bi + 1], w);
      }
    }
  }
  for (int r = 0; r < kR; ++r) {
    for (int c = 0; c < 2 * kB; ++c) {
      __m512 x = a[r][c];
      if constexpr (kFormat == KvBlockFormat::kQ4_1) {
        x = _mm512_add_ps(x, _mm512_set1_ps(msum[4 * (b0 + c / 2) + r]));
      }
      _mm512_storeu_ps(acc + r * dp + b0 * kQBlock + 16 * c, x);
    }
  }
}

template <int kR, KvBlockFormat kFormat>
SIEVE_VNNI_ATTR void PvRows(const float* p, int64_t tp, const float* alpha,
                            const uint8_t* const* v_rows, int64_t num_keys, int64_t head_dim,
                            const float* dv, const float* mv, float* acc, int64_t dp) {
  const int64_t num_blocks = head_dim / kQBlock;
  // pd[r][b][j] = p[r][j] * d_j of block b; msum[r][b] = sum_j p[r][j] * m_j (Q4_1).
  alignas(64) float pd[4 * 8 * kMaxKeys];
  float msum[8 * 4];  // [block][row]
  const int num_chunks = static_cast<int>((num_keys + 15) / 16);
  __m512 pc[kMaxChunks][kR];  // p of keys [16 c, 16 c + 16), 0 past num_keys
  for (int c = 0; c < num_chunks; ++c) {
    const int64_t n = std::min<int64_t>(16, num_keys - 16 * c);
    const auto mask = static_cast<__mmask16>(n >= 16 ? 0xFFFF : (1u << n) - 1);
    for (int r = 0; r < kR; ++r) pc[c][r] = _mm512_maskz_loadu_ps(mask, p + r * tp + 16 * c);
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    for (int c = 0; c < num_chunks; ++c) {
      const __m512 dc = _mm512_load_ps(dv + b * kMaxKeys + 16 * c);
      for (int r = 0; r < kR; ++r) {
        _mm512_store_ps(pd + (r * num_blocks + b) * kMaxKeys + 16 * c, _mm512_mul_ps(pc[c][r], dc));
      }
    }
    if constexpr (kFormat == KvBlockFormat::kQ4_1) {
      // The 4 rows' sums at once: pairwise interleaved adds, then the 128-bit chunks.
      __m512 x[4];
      for (int r = 0; r < 4; ++r) x[r] = _mm512_setzero_ps();
      for (int c = 0; c < num_chunks; ++c) {
        const __m512 mc = _mm512_load_ps(mv + b * kMaxKeys + 16 * c);
        for (int r = 0; r < kR; ++r) x[r] = _mm512_fmadd_ps(pc[c][r], mc, x[r]);
      }
      const __m512d ab = _mm512_castps_pd(
          _mm512_add_ps(_mm512_unpacklo_ps(x[0], x[1]), _mm512_unpackhi_ps(x[0], x[1])));
      const __m512d ce = _mm512_castps_pd(
          _mm512_add_ps(_mm512_unpacklo_ps(x[2], x[3]), _mm512_unpackhi_ps(x[2], x[3])));
      __m512 sums = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(ab, ce)),
                                  _mm512_castpd_ps(_mm512_unpackhi_pd(ab, ce)));
      sums = _mm512_add_ps(sums, _mm512_shuffle_f32x4(sums, sums, 0x4E));
      sums = _mm512_add_ps(sums, _mm512_shuffle_f32x4(sums, sums, 0xB1));
      _mm_storeu_ps(msum + 4 * b, _mm512_castps512_ps128(sums));
    }
  }
  int64_t b0 = 0;
  for (; b0 + 2 <= num_blocks; b0 += 2) {
    PvPass<kR, 2, kFormat>(pd, msum, num_blocks, alpha, v_rows, num_keys, b0, acc, dp);
  }
  if (b0 < num_blocks) {
    PvPass<kR, 1, kFormat>(pd, msum, num_blocks, alpha, v_rows, num_keys, b0, acc, dp);
  }
}

template <KvBlockFormat kFormat>
SIEVE_VNNI_ATTR void Pv(const float* p, int64_t tp, const float* alpha, int64_t count,
                        const uint8_t* const* v_rows, int64_t num_keys, int64_t head_dim,
                        float* acc, int64_t dp) {
  constexpr Layout kLayout = kFormat == KvBlockFormat::kQ8_0 ? Layout{34, 2} : Layout{20, 4};
  const int64_t num_blocks = head_dim / kQBlock;
  const uint8_t* rows[kMaxKeys];  // padded to 16 with the last row (its p is 0)
  for (int64_t j = 0; j < (num_keys + 15) / 16 * 16; ++j)
    rows[j] = v_rows[std::min(j, num_keys - 1)];
  alignas(64) float dv[8 * kMaxKeys], mv[8 * kMaxKeys];
  // Filled for the padded rows only: PvRows reads the 16-key chunks that hold keys, never past.
  for (int64_t b = 0; b < num_blocks; ++b) {
    BlockScales(rows, num_keys, b * kLayout.block_bytes, dv + b * kMaxKeys,
                kFormat == KvBlockFormat::kQ4_1 ? mv + b * kMaxKeys : nullptr);
  }
  for (int64_t m = 0; m < count; m += 4) {
    const float* pm = p + m * tp;
    float* am = acc + m * dp;
    switch (std::min<int64_t>(4, count - m)) {
      case 1:
        PvRows<1, kFormat>(pm, tp, alpha + m, v_rows, num_keys, head_dim, dv, mv, am, dp);
        break;
      case 2:
        PvRows<2, kFormat>(pm, tp, alpha + m, v_rows, num_keys, head_dim, dv, mv, am, dp);
        break;
      case 3:
        PvRows<3, kFormat>(pm, tp, alpha + m, v_rows, num_keys, head_dim, dv, mv, am, dp);
        break;
      default:
        PvRows<4, kFormat>(pm, tp, alpha + m, v_rows, num_keys, head_dim, dv, mv, am, dp);
        break;
    }
  }
}

}  // namespace

void attn_scores(KvBlockFormat format, const uint8_t* sets, int64_t count, int64_t head_dim,
                 const uint8_t* const* k_rows, int64_t num_keys, float* s, int64_t tp) {
  if (format == KvBlockFormat::kQ8_0) {
    Scores<KvBlockFormat::kQ8_0>(sets, count, head_dim, k_rows, num_keys, s, tp);
  } else {
    Scores<KvBlockFormat::kQ4_1>(sets, count, head_dim, k_rows, num_keys, s, tp);
  }
}

void attn_pv(KvBlockFormat format, const float* p, int64_t tp, const float* alpha, int64_t count,
             const uint8_t* const* v_rows, int64_t num_keys, int64_t head_dim, float* acc,
             int64_t dp) {
  if (format == KvBlockFormat::kQ8_0) {
    Pv<KvBlockFormat::kQ8_0>(p, tp, alpha, count, v_rows, num_keys, head_dim, acc, dp);
  } else {
    Pv<KvBlockFormat::kQ4_1>(p, tp, alpha, count, v_rows, num_keys, head_dim, acc, dp);
  }
}

#else

void attn_scores(KvBlockFormat, const uint8_t*, int64_t, int64_t, const uint8_t* const*, int64_t,
                 float*, int64_t) {}
void attn_pv(KvBlockFormat, const float*, int64_t, const float*, int64_t, const uint8_t* const*,
             int64_t, int64_t, float*, int64_t) {}

#endif

}  // namespace sieve::kernels::vnni
