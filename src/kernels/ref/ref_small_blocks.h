#pragma once
// Internal to src/kernels: the scalar reference matmul for the ggml blocks of 32 beyond
// Q8_0 / Q4_0 (Q4_1, Q5_0, Q5_1, IQ4_NL), called by ref::matmul.
#include <cstdint>

#include "kernels/ops.h"

namespace sieve::kernels::ref {

bool is_small_block(DType dtype);
// y[i][r] with ggml's semantics: x quantized to Q8_0 blocks; per block an exact integer sum
// d_w * d_x * sum_j(q_w[j] * q_x[j]), plus m_w * d_x * sum_j(q_x[j]) for Q4_1 / Q5_1.
void matmul_small_block(const MatrixView& w, const float* x, int64_t num_x, float* y);

}  // namespace sieve::kernels::ref
