// bf16 dot products for long attention jobs: see attention_bf16.h; the f32 path is
// cpu/attention-inl.h's QkKeysInLanes and Pv.
#include "kernels/cpu/attention_bf16.h"

#include "kernels/cpu/transpose16x16.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge source: false
// (maybe-)uninitialized warnings once inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define SIEVE_BF16_ATTR __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#endif

namespace sieve::kernels::bf16 {

#if defined(__x86_64__) && defined(__GNUC__)

bool supported() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
}

namespace {

// acc + the pairs of v . the pair at p in every lane.
SIEVE_BF16_ATTR inline __m512 DotBroadcast(__m512 acc, __m512i v, const uint32_t* p) {
  return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(v),
                          reinterpret_cast<__m512bh>(_mm512_set1_epi32(static_cast<int>(*p))));
}

// 16 lanes of a (and b) as bf16 pairs {a[j], b[j]}.
SIEVE_BF16_ATTR inline __m512i Interleave(__m512 a, __m512 b) {
  // cvtne2ps puts a's 16 values in elements 0-15 and b's in 16-31; element 2j takes a[j],
  // element 2j + 1 takes b[j].
  const __m512i index = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(index, reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(b, a)));
}

// Values [c, c + 16) of a row of f32 or (halves) f16 values, as f32.
SIEVE_BF16_ATTR inline __m512 Load16(const void* row, bool halves, int64_t c) {
  if (halves) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(row) + c)));
  }
  return _mm512_loadu_ps(static_cast<const float*>(row) + c);
}

// fn.template operator()<rows>() for 1 <= rows <= kMax (a tile's last rows); nothing for 0.
template <int kMax, class Fn>
SIEVE_BF16_ATTR inline void WithRows(int64_t rows, const Fn& fn) {
  if constexpr (kMax > 0) {
    if (rows == kMax) return fn.template operator()<kMax>();
    WithRows<kMax - 1>(rows, fn);
  }
}

// s rows m < kM, columns [0, 16 kC): pair dot products over num_pairs.
template <int kM, int kC>
SIEVE_BF16_ATTR inline void ScoreTile(const uint32_t* q, int64_t q_stride, const uint32_t* k,
                                      int64_t k_stride, int64_t num_pairs, float* s,
                                      int64_t s_stride) {
  __m512 acc[kM][kC];
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) acc[m][c] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < num_pairs; ++i) {
    __m512i kv[kC];
    for (int c = 0; c < kC; ++c) kv[c] = _mm512_loadu_si512(k + i * k_stride + 16 * c);
    for (int m = 0; m < kM; ++m) {
      for (int c = 0; c < kC; ++c) acc[m][c] = DotBroadcast(acc[m][c], kv[c], q + m * q_stride + i);
    }
  }
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) _mm512_storeu_ps(s + m * s_stride + 16 * c, acc[m][c]);
  }
}

template <int kC>
SIEVE_BF16_ATTR inline void ScoreColumns(const uint32_t* q, int64_t q_stride, int64_t count,
                                         const uint32_t* k, int64_t k_stride, int64_t num_pairs,
                                         float* s, int64_t s_stride) {
  constexpr int kRows = 8;  // 8 x kC accumulators; each key load serves 8 query vectors
  int64_t m = 0;
  for (; m + kRows <= count; m += kRows) {
    ScoreTile<kRows, kC>(q + m * q_stride, q_stride, k, k_stride, num_pairs, s + m * s_stride,
                         s_stride);
  }
  const uint32_t* qm = q + m * q_stride;
  float* sm = s + m * s_stride;
  WithRows<kRows - 1>(count - m, [&]<int kM>() SIEVE_BF16_ATTR {
    ScoreTile<kM, kC>(qm, q_stride, k, k_stride, num_pairs, sm, s_stride);
  });
}

// acc rows m < kM, columns [c0, c0 + 16 kC).
template <int kM, int kC>
SIEVE_BF16_ATTR inline void PvTile(const uint32_t* p, int64_t p_stride, const float* alpha,
                                   const uint32_t* v, int64_t num_pairs, int64_t head_dim,
                                   float* acc, int64_t dp, int64_t c0) {
  __m512 a[kM][kC];
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) {
      a[m][c] = _mm512_loadu_ps(acc + m * dp + c0 + 16 * c);
      // Past the first tiles the running max rarely moves (alpha = 1): x * 1 is x.
      if (alpha[m] != 1.0f) a[m][c] = _mm512_mul_ps(a[m][c], _mm512_set1_ps(alpha[m]));
    }
  }
  for (int64_t t = 0; t < num_pairs; ++t) {
    __m512i vv[kC];
    for (int c = 0; c < kC; ++c) vv[c] = _mm512_loadu_si512(v + t * head_dim + c0 + 16 * c);
    for (int m = 0; m < kM; ++m) {
      for (int c = 0; c < kC; ++c) a[m][c] = DotBroadcast(a[m][c], vv[c], p + m * p_stride + t);
    }
  }
  for (int m = 0; m < kM; ++m) {
    for (int c = 0; c < kC; ++c) _mm512_storeu_ps(acc + m * dp + c0 + 16 * c, a[m][c]);
  }
}

// Rows m < kM, every column: passes of 4 vectors, then one of 2 (head_dim is a multiple of 32).
template <int kM>
SIEVE_BF16_ATTR inline void PvRows(const uint32_t* p, int64_t p_stride, const float* alpha,
                                   const uint32_t* v, int64_t num_pairs, int64_t head_dim,
                                   float* acc, int64_t dp) {
  int64_t c0 = 0;
  for (; c0 + 64 <= head_dim; c0 += 64)
    PvTile<kM, 4>(p, p_stride, alpha, v, num_pairs, head_dim, acc, dp, c0);
  if (c0 < head_dim) PvTile<kM, 2>(p, p_stride, alpha, v, num_pairs, head_dim, acc, dp, c0);
}

}  // namespace

SIEVE_BF16_ATTR void round_row(const float* src, int64_t n, uint16_t* dst) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32) {
    const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + j + 16), _mm512_loadu_ps(src + j));
    _mm512_storeu_si512(dst + j, reinterpret_cast<__m512i>(r));
  }
  if (j < n) {
    const int64_t rest = n - j;  // 1 .. 31
    const __mmask16 low = rest >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << rest) - 1);
    const __mmask16 high = rest > 16 ? static_cast<__mmask16>((1u << (rest - 16)) - 1) : 0;
    const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(high, src + j + 16),
                                           _mm512_maskz_loadu_ps(low, src + j));
    const __mmask32 lanes = static_cast<__mmask32>((uint64_t{1} << rest) - 1);
    _mm512_mask_storeu_epi16(dst + j, lanes, reinterpret_cast<__m512i>(r));
  }
}

SIEVE_BF16_ATTR void pack_keys(const void* const* rows, bool halves, int64_t num_keys,
                               int64_t num_cols, int64_t head_dim, uint32_t* k, int64_t tp) {
  // Per 16 keys and 32 dims: each key's 32 values as 16 pairs (cvtne2ps keeps them in order),
  // then one 16 x 16 transpose of the 32-bit pairs puts the keys in lanes.
  for (int64_t j0 = 0; j0 < num_cols; j0 += 16) {
    for (int64_t c = 0; c < head_dim; c += 32) {
      __m512i pairs[16];
      for (int64_t e = 0; e < 16; ++e) {
        if (j0 + e >= num_keys) {
          pairs[e] = _mm512_setzero_si512();
          continue;
        }
        pairs[e] = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(
            Load16(rows[j0 + e], halves, c + 16), Load16(rows[j0 + e], halves, c)));
      }
      alignas(64) uint32_t block[16 * 16];
      Transpose16x16(pairs, reinterpret_cast<uint8_t*>(block));
      for (int64_t e = 0; e < 16; ++e) {
        _mm512_storeu_si512(k + (c / 2 + e) * tp + j0, _mm512_load_si512(block + 16 * e));
      }
    }
  }
}

SIEVE_BF16_ATTR void pack_values(const void* const* rows, bool halves, int64_t num_keys,
                                 int64_t head_dim, uint32_t* v) {
  for (int64_t t = 0; 2 * t < num_keys; ++t) {
    const void* a = rows[2 * t];
    const void* b = 2 * t + 1 < num_keys ? rows[2 * t + 1] : nullptr;
    for (int64_t c = 0; c < head_dim; c += 16) {
      const __m512 y = b ? Load16(b, halves, c) : _mm512_setzero_ps();
      _mm512_storeu_si512(v + t * head_dim + c, Interleave(Load16(a, halves, c), y));
    }
  }
}

SIEVE_BF16_ATTR void scores(const uint32_t* q, int64_t q_stride, int64_t count, const uint32_t* k,
                            int64_t k_stride, int64_t num_pairs, int64_t num_cols, float* s,
                            int64_t s_stride) {
  int64_t j = 0;
  for (; j + 32 <= num_cols; j += 32)
    ScoreColumns<2>(q, q_stride, count, k + j, k_stride, num_pairs, s + j, s_stride);
  if (j < num_cols)
    ScoreColumns<1>(q, q_stride, count, k + j, k_stride, num_pairs, s + j, s_stride);
}

SIEVE_BF16_ATTR void pv(const uint32_t* p, int64_t p_stride, int64_t count, const float* alpha,
                        const uint32_t* v, int64_t num_pairs, int64_t head_dim, float* acc,
                        int64_t dp) {
  constexpr int kRows = 6;  // 6 x 4 accumulators + 4 value vectors; each value load serves 6
  int64_t m = 0;
  for (; m + kRows <= count; m += kRows)
    PvRows<kRows>(p + m * p_stride, p_stride, alpha + m, v, num_pairs, head_dim, acc + m * dp, dp);
  const uint32_t* pm = p + m * p_stride;
  float* am = acc + m * dp;
  WithRows<kRows - 1>(count - m, [&]<int kM>() SIEVE_BF16_ATTR {
    PvRows<kM>(pm, p_stride, alpha + m, v, num_pairs, head_dim, am, dp);
  });
}

#else  // not x86-64 with GCC/Clang

bool supported() { return false; }
void round_row(const float*, int64_t, uint16_t*) {}
void pack_keys(const void* const*, bool, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void pack_values(const void* const*, bool, int64_t, int64_t, uint32_t*) {}
void scores(const uint32_t*, int64_t, int64_t, const uint32_t*, int64_t, int64_t, int64_t, float*,
            int64_t) {}
void pv(const uint32_t*, int64_t, int64_t, const float*, const uint32_t*, int64_t, int64_t, float*,
        int64_t) {}

#endif

}  // namespace sieve::kernels::bf16
