#pragma once
// Internal to src/kernels/cpu: what the AVX-512 VNNI translation units (matmul_vnni.cc,
// matmul_vnni_small_blocks.cc, matmul_super_blocks_vnni.cc) share: the intrinsics, the target
// attribute their functions carry (SIEVE_VNNI is 0 where there are none), the column slices of
// the prefill loops and the scale spreading. Include it only from those files: everything here
// is compiled for AVX-512 via SIEVE_VNNI_ATTR, not the file's flags.
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics pass _mm512_undefined_*() as the unused merge source: false
// (maybe-)uninitialized warnings once inlined.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#define SIEVE_VNNI 1
#define SIEVE_VNNI_ATTR \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,f16c,fma")))
#else
#define SIEVE_VNNI 0
#endif

namespace sieve::kernels::vnni {

// Blocks [begin, end) of a column slice of the prefill loops.
struct Slice {
  int64_t begin, end;  // blocks
  bool accumulate;     // add to y (not the first slice)
};

#if SIEVE_VNNI

// {d[0] x 8, d[1] x 8} from the first one or two f32 lanes of v (lane 1 zero for one block).
SIEVE_VNNI_ATTR inline __m512 SpreadPair(__m128 v) {
  const __m512i index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(index, _mm512_zextps128_ps512(v));
}

#endif

}  // namespace sieve::kernels::vnni
