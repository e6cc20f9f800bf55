#pragma once
// Internal to src/kernels: scalar (de)quantization of the ggml block types beyond Q8_0 / Q4_0,
// bit-exact with ggml's reference functions. ops.cc's quantize_row / dequantize_row dispatch
// here; the SIMD matmul kernels and their tests use the same decodings.
#include <cstdint>

#include "kernels/blocks.h"
#include "kernels/ops.h"

namespace sieve::kernels::quant {

// Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32): quant_small_blocks.cc.
void quantize_row_small_block(DType dtype, const float* src, void* dst, int64_t n);
void dequantize_row_small_block(DType dtype, const void* src, float* dst, int64_t n);

// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (super-blocks of 256): quant_super_blocks.cc/.h.
void quantize_row_super_block(DType dtype, const float* src, void* dst, int64_t n);
void dequantize_row_super_block(DType dtype, const void* src, float* dst, int64_t n);

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
