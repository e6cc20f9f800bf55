#pragma once
// Internal to src/kernels: scalar (de)quantization of the ggml block types beyond Q8_0 / Q4_0,
// bit-exact with ggml's reference functions. ops.cc's quantize_row / dequantize_row dispatch
// here; the SIMD matmul kernels and their tests use the same decodings.
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/ops.h"

namespace sieve::kernels::quant {

// One type's rows of n values (a multiple of its block): the entries of ops.cc's row codec
// table, the one place quantize_row() / dequantize_row() choose by dtype.
#define SIEVE_ROW_CODEC(suffix)                                       \
  void quantize_row_##suffix(const float* src, void* dst, int64_t n); \
  void dequantize_row_##suffix(const void* src, float* dst, int64_t n)
// Blocks of 32: quant_small_blocks.cc.
SIEVE_ROW_CODEC(q4_1);
SIEVE_ROW_CODEC(q5_0);
SIEVE_ROW_CODEC(q5_1);
SIEVE_ROW_CODEC(iq4_nl);
// Super-blocks of 256: quant_super_blocks.cc/.h.
SIEVE_ROW_CODEC(q2_k);
SIEVE_ROW_CODEC(q3_k);
SIEVE_ROW_CODEC(q4_k);
SIEVE_ROW_CODEC(q5_k);
SIEVE_ROW_CODEC(q6_k);
SIEVE_ROW_CODEC(iq4_xs);
#undef SIEVE_ROW_CODEC

// Index of the level of kIQ4NLValues nearest to v (ggml's best_index_int8: bisection, ties to
// the upper level). Shared by the IQ4_NL and IQ4_XS quantizers.
inline int nearest_iq4nl_level(float v) {
  constexpr int kLevels = 16;
  if (v <= kIQ4NLValues[0]) return 0;
  if (v >= kIQ4NLValues[kLevels - 1]) return kLevels - 1;
  int lo = 0, hi = kLevels - 1;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < kIQ4NLValues[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return v - kIQ4NLValues[hi - 1] < kIQ4NLValues[hi] - v ? hi - 1 : hi;
}

}  // namespace sieve::kernels::quant
