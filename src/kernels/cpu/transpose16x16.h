#pragma once
// Internal to src/kernels/cpu: the 16 x 16 transpose of 32-bit lanes that both AVX-512 prefill
// paths use to lay 16 weight rows out as vpdpbusd tiles — the Highway AVX3 target of
// matmul_super_blocks.cc and the VNNI files. It needs AVX-512F only, so it inlines into either.
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace sieve::kernels {

// out + 64 k receives 4-byte lane k of each of the 16 rows (32-bit and 64-bit interleaves
// within 128-bit lanes, then two 128-bit lane shuffles).
__attribute__((target("avx512f"), always_inline)) inline void Transpose16x16(const __m512i* rows,
                                                                             uint8_t* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
  }
  // b[4i + e], 128-bit lane L: element 4L + e of rows 4i .. 4i + 3.
  for (int i = 0; i < 4; ++i) {
    b[4 * i + 0] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i low01 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0x44),
                  low23 = _mm512_shuffle_i32x4(b[e], b[4 + e], 0xEE);
    const __m512i high01 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0x44);
    const __m512i high23 = _mm512_shuffle_i32x4(b[8 + e], b[12 + e], 0xEE);
    _mm512_store_si512(out + 64 * (0 + e), _mm512_shuffle_i32x4(low01, high01, 0x88));
    _mm512_store_si512(out + 64 * (4 + e), _mm512_shuffle_i32x4(low01, high01, 0xDD));
    _mm512_store_si512(out + 64 * (8 + e), _mm512_shuffle_i32x4(low23, high23, 0x88));
    _mm512_store_si512(out + 64 * (12 + e), _mm512_shuffle_i32x4(low23, high23, 0xDD));
  }
}

}  // namespace sieve::kernels
#endif
