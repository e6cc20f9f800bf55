#pragma once
// Internal to src/kernels/cpu: what the AVX-512 VNNI translation units (matmul_vnni.cc,
// matmul_vnni_small_blocks.cc, matmul_super_blocks_vnni.cc) share: the intrinsics, the target
// attribute their functions carry (SIEVE_VNNI is 0 where there are none), the column slices of
// the prefill loops and the scale spreading. Include it only from those files: everything here
// is compiled for AVX-512 via SIEVE_VNNI_ATTR, not the file's flags.
#include <array>
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/cpu/transpose16x16.h"

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

// IQ4_NL's levels + 128 (1 .. 241) as unsigned bytes: vpdpbusd's unsigned operand.
constexpr std::array<uint8_t, 16> BiasedIQ4NLValues() {
  std::array<uint8_t, 16> biased{};
  for (int k = 0; k < 16; ++k) biased[k] = static_cast<uint8_t>(kIQ4NLValues[k] + 128);
  return biased;
}

// Blocks [begin, end) of a column slice of the prefill loops.
struct Slice {
  int64_t begin, end;  // blocks
  bool accumulate;     // add to y (not the first slice)
};

#if SIEVE_VNNI

// acc + u . (the 4 activation bytes at p in every int32 lane): vpdpbusd against 4 columns of 16
// rows, the activations read by its embedded broadcast ({1to16}). GCC does not fold
// _mm512_set1_epi32 of a load into the instruction; the separate vpbroadcastd it emits cost
// 5-25% of packed prefill (one thread, 4096x4096 x 256 rows, best of 5: Q4_0 262-313 -> 323-329,
// Q8_0 235-286 -> 292-307 GFLOP/s).
SIEVE_VNNI_ATTR inline __m512i DpbusdBroadcast(__m512i acc, __m512i u, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// acc + v * (the float at p in every lane), p read by the FMA's embedded broadcast: as
// DpbusdBroadcast, GCC would emit a separate vbroadcastss.
SIEVE_VNNI_ATTR inline __m512 FmaddBroadcast(__m512 acc, __m512 v, const float* p) {
  asm("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(v), "m"(*p));
  return acc;
}

// Packed weights stream from memory as one sequence per thread, where the unpacked tiles read 16
// rows' streams at once. On the Intel VM of sessions 26-32 the hardware prefetchers alone kept
// too few lines of one stream in flight (packed Q6_K from DRAM, one thread, 9-13 GB/s against
// 16-21 unpacked), so the packed tiles prefetch each block's bytes this far ahead into L2
// (PREFETCHT1: prefetching into L1 instead gained nothing, it holds L1's few miss buffers), on
// Intel CPUs only: on Zen 4 the hardware prefetchers drew more alone (packed_block_prefetch()).
inline constexpr int64_t kPackedPrefetchBytes = 8192;
// A block's lines; with kParts > 1, spread over the block's kParts steps (this is step `part`):
// a burst of up to 53 prefetches per block keeps the fill buffers from the tile's own loads.
template <int64_t kBytes, int kParts = 1>
SIEVE_VNNI_ATTR inline void PrefetchPackedAhead(const uint8_t* block, int part = 0) {
  constexpr int64_t kLines = (kBytes + 63) / 64;
  const int64_t end = kLines * (part + 1) / kParts;
  for (int64_t line = kLines * part / kParts; line < end; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(block + kPackedPrefetchBytes + 64 * line),
                 _MM_HINT_T1);
}

// {d[0] x 8, d[1] x 8} from the first one or two f32 lanes of v (lane 1 zero for one block).
SIEVE_VNNI_ATTR inline __m512 SpreadPair(__m128 v) {
  const __m512i index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(index, _mm512_zextps128_ps512(v));
}

#endif

}  // namespace sieve::kernels::vnni
