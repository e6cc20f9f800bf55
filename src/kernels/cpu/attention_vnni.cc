// Paged attention on Q8_0 / Q4_1 K/V tiles with AVX-512 VNNI: see attention_vnni.h; the portable
// path is cpu/attention-inl.h (tiles dequantized to f32), the reference paged_attention_ref.cc.
#include "kernels/cpu/attention_vnni.h"

#include <algorithm>
#include <cstring>

#include "kernels/blocks.h"
#include "kernels/cpu/vnni_common.h"

namespace sieve::kernels::vnni {

namespace {

inline constexpr int64_t kMaxKeys = 32;  // keys per tile at most (attention-inl.h's kTileKeys)

struct Layout {
  int64_t block_bytes;  // 34 (Q8_0) / 20 (Q4_1)
  int64_t qs_offset;    // the quants' offset in a block
};
inline Layout LayoutOf(KvBlockFormat format) {
  return format == KvBlockFormat::kQ8_0 ? Layout{34, 2} : Layout{20, 4};
}

}  // namespace

size_t attn_query_set_bytes(int64_t head_dim) {
  // head_dim / 4 Q vectors, then per block its d vector and correction vector (64 bytes each).
  return static_cast<size_t>(head_dim / 4 * 64 + head_dim / kQBlock * 128);
}

void attn_prepare_queries(KvBlockFormat format, const int8_t* q, const float* d, int64_t count,
                          int64_t head_dim, uint8_t* sets) {
  const int64_t num_blocks = head_dim / kQBlock;
  const size_t set_bytes = attn_query_set_bytes(head_dim);
  for (int64_t set = 0; set * 4 < count; ++set) {
    uint8_t* out = sets + set * set_bytes;
    std::memset(out, 0, set_bytes);
    auto* qv = reinterpret_cast<uint32_t*>(out);
    auto* scales = reinterpret_cast<float*>(out + head_dim / 4 * 64);
    for (int64_t m = 0; m < 4 && set * 4 + m < count; ++m) {
      const int64_t v = set * 4 + m;
      const int8_t* row = q + v * head_dim;
      for (int64_t g = 0; g < head_dim / 4; ++g) {
        uint32_t word;
        std::memcpy(&word, row + 4 * g, 4);
        for (int64_t j = 0; j < 4; ++j) qv[g * 16 + 4 * j + m] = word;
      }
      for (int64_t b = 0; b < num_blocks; ++b) {
        int32_t sum = 0;
        for (int64_t i = 0; i < kQBlock; ++i) sum += row[b * kQBlock + i];
        const float dq = d[v * num_blocks + b];
        float* dvec = scales + b * 32;
        for (int64_t j = 0; j < 4; ++j) {
          dvec[4 * j + m] = dq;
          if (format == KvBlockFormat::kQ8_0) {  // K bytes biased by 128: subtract 128 * sum q
            const int32_t bias = 128 * sum;
            std::memcpy(&dvec[16 + 4 * j + m], &bias, 4);
          } else {  // Q4_1's minimum: m_k * (d_q * sum q)
            dvec[16 + 4 * j + m] = dq * static_cast<float>(sum);
          }
        }
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

// acc[s] += sum over the piece's 4 dwords t of vpdpbusd(dword t of each key, Q vector g0 + t).
template <int kS>
SIEVE_VNNI_ATTR inline void DotPiece(__m512i piece, const uint8_t* const* set_q, int64_t g0,
                                     __m512i* acc) {
  const __m512i k0 = _mm512_shuffle_epi32(piece, _MM_PERM_AAAA);
  const __m512i k1 = _mm512_shuffle_epi32(piece, _MM_PERM_BBBB);
  const __m512i k2 = _mm512_shuffle_epi32(piece, _MM_PERM_CCCC);
  const __m512i k3 = _mm512_shuffle_epi32(piece, _MM_PERM_DDDD);
  for (int s = 0; s < kS; ++s) {
    const auto* qv = reinterpret_cast<const __m512i*>(set_q[s]) + g0;
    acc[s] = _mm512_dpbusd_epi32(acc[s], k0, _mm512_load_si512(qv));
    acc[s] = _mm512_dpbusd_epi32(acc[s], k1, _mm512_load_si512(qv + 1));
    acc[s] = _mm512_dpbusd_epi32(acc[s], k2, _mm512_load_si512(qv + 2));
    acc[s] = _mm512_dpbusd_epi32(acc[s], k3, _mm512_load_si512(qv + 3));
  }
}

// Scores of kS sets (set_q[s]: its bytes; rows[s]: its vectors, <= 4) against keys [j0, j0 + 4).
template <int kS, KvBlockFormat kFormat>
SIEVE_VNNI_ATTR inline void ScoreGroup(const uint8_t* const* set_q, const int64_t* set_rows,
                                       int64_t head_dim, const uint8_t* const* rows, int64_t j0,
                                       float* const* outs, int64_t tp) {
  constexpr Layout kLayout = kFormat == KvBlockFormat::kQ8_0 ? Layout{34, 2} : Layout{20, 4};
  const int64_t num_blocks = head_dim / kQBlock;
  const __m512i spread_d = _mm512_set_epi32(6, 6, 6, 6, 4, 4, 4, 4, 2, 2, 2, 2, 0, 0, 0, 0);
  const __m512i spread_m = _mm512_set_epi32(7, 7, 7, 7, 5, 5, 5, 5, 3, 3, 3, 3, 1, 1, 1, 1);
  __m512 score[kS];
  for (int s = 0; s < kS; ++s) score[s] = _mm512_setzero_ps();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t at = b * kLayout.block_bytes + kLayout.qs_offset;
    __m512i acc[kS];
    for (int s = 0; s < kS; ++s) acc[s] = _mm512_setzero_si512();
    if constexpr (kFormat == KvBlockFormat::kQ8_0) {
      const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
      DotPiece<kS>(_mm512_xor_si512(Load4(rows + j0, at), bias), set_q, 8 * b, acc);
      DotPiece<kS>(_mm512_xor_si512(Load4(rows + j0, at + 16), bias), set_q, 8 * b + 4, acc);
    } else {
      const __m512i nibbles = Load4(rows + j0, at);
      const __m512i low = _mm512_set1_epi8(0x0F);
      DotPiece<kS>(_mm512_and_si512(nibbles, low), set_q, 8 * b, acc);
      DotPiece<kS>(_mm512_and_si512(_mm512_srli_epi16(nibbles, 4), low), set_q, 8 * b + 4, acc);
    }
    // Lane 4 j + m: d_k of key j0 + j (and m_k): {d0, m0, d1, m1, ...} spread.
    const __m512 dm =
        _mm512_castps256_ps512(_mm256_cvtph_ps(Words4(rows + j0, b * kLayout.block_bytes)));
    const __m512 dk4 = _mm512_permutexvar_ps(spread_d, dm);
    const __m512 mk4 =
        kFormat == KvBlockFormat::kQ4_1 ? _mm512_permutexvar_ps(spread_m, dm) : _mm512_setzero_ps();
    for (int s = 0; s < kS; ++s) {
      const auto* scales = reinterpret_cast<const __m512*>(set_q[s] + head_dim / 4 * 64) + 2 * b;
      const __m512 dq = _mm512_load_ps(reinterpret_cast<const float*>(scales));
      if constexpr (kFormat == KvBlockFormat::kQ8_0) {
        const __m512i bias = _mm512_load_si512(scales + 1);
        score[s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[s], bias)),
                                   _mm512_mul_ps(dk4, dq), score[s]);
      } else {
        score[s] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[s]), _mm512_mul_ps(dk4, dq), score[s]);
        score[s] = _mm512_fmadd_ps(mk4, _mm512_load_ps(reinterpret_cast<const float*>(scales + 1)),
                                   score[s]);
      }
    }
  }
  // Lane 4 j + m -> lane 4 m + j: chunk m is query m's 4 scores.
  const __m512i transpose = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
  for (int s = 0; s < kS; ++s) {
    const __m512 t = _mm512_permutexvar_ps(transpose, score[s]);
    float* out = outs[s] + j0;
    _mm_storeu_ps(out, _mm512_castps512_ps128(t));
    if (set_rows[s] > 1) _mm_storeu_ps(out + tp, _mm512_extractf32x4_ps(t, 1));
    if (set_rows[s] > 2) _mm_storeu_ps(out + 2 * tp, _mm512_extractf32x4_ps(t, 2));
    if (set_rows[s] > 3) _mm_storeu_ps(out + 3 * tp, _mm512_extractf32x4_ps(t, 3));
  }
}

template <KvBlockFormat kFormat>
SIEVE_VNNI_ATTR void Scores(const uint8_t* sets, int64_t count, int64_t head_dim,
                            const uint8_t* const* k_rows, int64_t num_keys, float* s, int64_t tp) {
  const int64_t padded = (num_keys + 3) / 4 * 4;
  const uint8_t* rows[kMaxKeys];
  for (int64_t j = 0; j < padded; ++j) rows[j] = k_rows[std::min(j, num_keys - 1)];
  const size_t set_bytes = attn_query_set_bytes(head_dim);
  const int64_t num_sets = (count + 3) / 4;
  for (int64_t set0 = 0; set0 < num_sets; set0 += 4) {
    const int kS = static_cast<int>(std::min<int64_t>(4, num_sets - set0));
    const uint8_t* set_q[4];
    int64_t set_rows[4];
    float* out[4];
    for (int i = 0; i < kS; ++i) {
      set_q[i] = sets + (set0 + i) * set_bytes;
      set_rows[i] = std::min<int64_t>(4, count - (set0 + i) * 4);
      out[i] = s + (set0 + i) * 4 * tp;
    }
    for (int64_t j0 = 0; j0 < num_keys; j0 += 4) {
      switch (kS) {
        case 1:
          ScoreGroup<1, kFormat>(set_q, set_rows, head_dim, rows, j0, out, tp);
          break;
        case 2:
          ScoreGroup<2, kFormat>(set_q, set_rows, head_dim, rows, j0, out, tp);
          break;
        case 3:
          ScoreGroup<3, kFormat>(set_q, set_rows, head_dim, rows, j0, out, tp);
          break;
        default:
          ScoreGroup<4, kFormat>(set_q, set_rows, head_dim, rows, j0, out, tp);
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
        const __m512 w = _mm512_set1_ps(pd[(r * num_blocks + b0 + bi) * kMaxKeys + j]);
        a[r][2 * bi] = _mm512_fmadd_ps(w, v[2 * bi], a[r][2 * bi]);
        a[r][2 * bi + 1] = _mm512_fmadd_ps(w, v[2 * bi + 1], a[r][2 * bi + 1]);
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
  const __mmask16 tail0 = static_cast<__mmask16>(num_keys >= 16 ? 0xFFFF : (1u << num_keys) - 1);
  const __mmask16 tail1 = static_cast<__mmask16>(num_keys >= 32   ? 0xFFFF
                                                 : num_keys <= 16 ? 0
                                                                  : (1u << (num_keys - 16)) - 1);
  __m512 p0[kR], p1[kR];
  for (int r = 0; r < kR; ++r) {
    p0[r] = _mm512_maskz_loadu_ps(tail0, p + r * tp);
    p1[r] = _mm512_maskz_loadu_ps(tail1, p + r * tp + 16);
  }
  for (int64_t b = 0; b < num_blocks; ++b) {
    const __m512 d0 = _mm512_load_ps(dv + b * kMaxKeys),
                 d1 = _mm512_load_ps(dv + b * kMaxKeys + 16);
    for (int r = 0; r < kR; ++r) {
      float* out = pd + (r * num_blocks + b) * kMaxKeys;
      _mm512_store_ps(out, _mm512_mul_ps(p0[r], d0));
      _mm512_store_ps(out + 16, _mm512_mul_ps(p1[r], d1));
    }
    if constexpr (kFormat == KvBlockFormat::kQ4_1) {
      // The 4 rows' sums at once: pairwise interleaved adds, then the 128-bit chunks.
      const __m512 m0 = _mm512_load_ps(mv + b * kMaxKeys),
                   m1 = _mm512_load_ps(mv + b * kMaxKeys + 16);
      __m512 x[4];
      for (int r = 0; r < 4; ++r) {
        x[r] = r < kR ? _mm512_fmadd_ps(p1[r], m1, _mm512_mul_ps(p0[r], m0)) : _mm512_setzero_ps();
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
  // PvRows reads all kMaxKeys scales of a block; those past the padded rows must be 0, not
  // stack garbage (0 * NaN would poison the accumulators of a short tile).
  const int64_t num_filled = (num_keys + 15) / 16 * 16;
  for (int64_t b = 0; b < num_blocks; ++b) {
    BlockScales(rows, num_keys, b * kLayout.block_bytes, dv + b * kMaxKeys,
                kFormat == KvBlockFormat::kQ4_1 ? mv + b * kMaxKeys : nullptr);
    std::fill(dv + b * kMaxKeys + num_filled, dv + (b + 1) * kMaxKeys, 0.0f);
    if (kFormat == KvBlockFormat::kQ4_1)
      std::fill(mv + b * kMaxKeys + num_filled, mv + (b + 1) * kMaxKeys, 0.0f);
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
