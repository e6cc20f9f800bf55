#pragma once
// Internal to src/kernels: matmul() for the weight types beyond F32/F16/BF16/Q8_0/Q4_0, each
// group in its own translation unit (dispatched per Highway target inside).
#include <cstdint>

#include "kernels/ops.h"

namespace sieve::kernels {

// Q4_1, Q5_0, Q5_1, IQ4_NL: activations quantized to Q8_0 (cpu/matmul_small_blocks.cc).
void matmul_small_block(const MatrixView& w, const float* x, int64_t num_x, float* y,
                        ThreadPool& pool);
// Q2_K .. Q6_K, IQ4_XS: activations quantized to Q8_K (cpu/matmul_super_blocks.cc).
void matmul_super_block(const MatrixView& w, const float* x, int64_t num_x, float* y,
                        ThreadPool& pool);

}  // namespace sieve::kernels
