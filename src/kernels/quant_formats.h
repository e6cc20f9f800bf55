#pragma once
// Internal to src/kernels: scalar (de)quantization of the ggml block types beyond Q8_0 / Q4_0,
// bit-exact with ggml's reference functions. ops.cc's quantize_row / dequantize_row dispatch
// here; the SIMD matmul kernels and their tests use the same decodings.
#include <cstdint>

#include "kernels/ops.h"

namespace sieve::kernels::quant {

// Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32): quant_small_blocks.cc.
void quantize_row_small_block(DType dtype, const float* src, void* dst, int64_t n);
void dequantize_row_small_block(DType dtype, const void* src, float* dst, int64_t n);

// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (super-blocks of 256): quant_super_blocks.cc/.h.
void quantize_row_super_block(DType dtype, const float* src, void* dst, int64_t n);
void dequantize_row_super_block(DType dtype, const void* src, float* dst, int64_t n);

}  // namespace sieve::kernels::quant
